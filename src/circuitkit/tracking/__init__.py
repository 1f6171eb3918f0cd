"""Scores along a training run: ``circuitkit.track(checkpoints) -> Track`` and the phase change located.

(The package is called ``tracking``, not ``track``: a submodule named like the public function ``circuitkit.track``
would replace it on import.)

- :mod:`~circuitkit.tracking.sources`: checkpoints, their steps and labels, loading one at a time;
- :mod:`~circuitkit.tracking.measure`: one checkpoint measured (head scores, ICL score, composition edges);
- :mod:`~circuitkit.tracking.phase`: the phase change and the formation of heads (definitions and limits);
- :mod:`~circuitkit.tracking.result`: :class:`Track`, ``track.json``, per-checkpoint records, :func:`merge`;
- :mod:`~circuitkit.tracking.run`: :func:`track`, the loop.

Scaling out: every checkpoint's record is a file of its own (``DIR/track-step<N>.json``), so separate processes
or jobs can each measure some checkpoints into one shared directory with ``write_track=False``
(``circuitkit track CKPT --out DIR --no-merge``) and one last step assembles ``track.json`` and the report
(:func:`merge`, ``circuitkit track --merge DIR``). A Slurm job array, one checkpoint per task::

    #SBATCH --array=0-153
    CKPT=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" checkpoints.txt)   # one checkpoint per line
    circuitkit track "$CKPT" --out runs/pythia-70m --no-merge
    # then, once all tasks are done (e.g. a job with --dependency=afterok:<array id>):
    circuitkit track --merge runs/pythia-70m
"""

from __future__ import annotations

from circuitkit.tracking.result import SavedTrack, Track, merge
from circuitkit.tracking.run import track
from circuitkit.tracking.sources import load_checkpoint, step_from_name

__all__ = ["SavedTrack", "Track", "load_checkpoint", "merge", "step_from_name", "track"]
