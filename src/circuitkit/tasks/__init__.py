"""Tasks: behaviours as clean/corrupted prompt pairs, their metrics, and circuits found on them.

    import circuitkit as ck
    task = ck.tasks.ioi(model, n=32)                 # or ck.tasks.load_task("pairs.jsonl"), Task.from_pairs([...])
    result = ck.scan(model, task=task)               # node and edge circuits, faithfulness curves, CPR / CMD
    result.save("out")                               # report.html + scores.json
    ck.tasks.edge_effects(model, task, ["9.9->logits"])  # any edge's exact effect, with its interval
"""

from circuitkit.edge_effect import EdgeEffect
from circuitkit.graph.metrics import METRICS
from circuitkit.graph.task import Pair, Task, TaskBatch, UserMetric
from circuitkit.tasks.circuit import EDGE_FRACTIONS, TaskCircuit
from circuitkit.tasks.effects import edge_effects
from circuitkit.tasks.files import load_task
from circuitkit.tasks.generators import BUILT_IN, GENERATORS, docstring, greater_than, ioi, repeated_tokens
from circuitkit.tasks.scan import TaskScan, scan_task


def get_task(name_or_path: str, model: object, *, n: int | None = None, seed: int = 0) -> Task:
    """A built-in task by name (:data:`GENERATORS`) written for ``model``'s tokenizer, or a task file's path.
    ``n``: the pairs a built-in task writes (None: the task's own default, 32; ``repeated-tokens``: 16, the
    induction scan's batch, so that ``--task repeated-tokens`` reads the induction scan's sequences)."""
    import os

    from circuitkit import validate

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise validate.fail("get_task: name_or_path", name_or_path,
                            f"a built-in task's name ({', '.join(GENERATORS)}) or a task file's path")
    if name_or_path in GENERATORS:
        make = GENERATORS[name_or_path]
        return make(model, seed=seed) if n is None else make(model, n, seed=seed)
    return load_task(name_or_path)


__all__ = [
    "BUILT_IN", "EDGE_FRACTIONS", "GENERATORS", "METRICS", "EdgeEffect", "Pair", "Task", "TaskBatch", "TaskCircuit",
    "TaskScan", "UserMetric", "docstring", "edge_effects", "get_task", "greater_than", "ioi", "load_task",
    "repeated_tokens", "scan_task",
]
