"""circuitkit.track along the bundled model's own training run: the phase change it locates agrees with a plain
forward pass written here, the heads it names are the documented ones, and bad input, interruption, resume and
merging behave.

The series is the first 800 steps of the bundled run (``circuitkit.zoo.train.train_series``: same recipe, seed and
schedule; checkpoints every 50 steps), built once per session (~20-50 s on 2 shared cores)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, zoo
from circuitkit.detect.tokens import TokenBatch
from circuitkit.tracking import merge
from circuitkit.tracking import run as track_run
from circuitkit.tracking.result import RECORD_PREFIX, Track
from circuitkit.tracking.sources import step_from_name
from circuitkit.zoo import train
from tests.test_zoo import _dense_attention_only_logits

BLOCK, BATCH, BOS = 20, 16, 0
ICL_TOL = 1e-4
"""The dense float32 forward here and TransformerLens's differ in op order (~1e-5 on losses of ~4 nats); records
keep 6 decimals."""
PHASE_WINDOW = (500, 700)
"""The bundled run's curve (zoo curve.json) drops its repeated-copy loss between these steps."""


@pytest.fixture(scope="session")
def series(tmp_path_factory) -> list[Path]:
    return train.train_series(tmp_path_factory.mktemp("series"))


@pytest.fixture(scope="session")
def tokens() -> TokenBatch:
    """``<bos> block block`` with ``BLOCK`` distinct ids from 1..63, written here (not by circuitkit's builder)."""
    generator = torch.Generator().manual_seed(1234)
    block = torch.rand(BATCH, 63, generator=generator).argsort(dim=-1)[:, :BLOCK] + 1
    ids = torch.cat([torch.full((BATCH, 1), BOS), block, block], dim=1)
    return TokenBatch(tokens=ids, block_len=BLOCK, n_repeats=2, bos=BOS)


@pytest.fixture(scope="session")
def tracked(series, tokens, tmp_path_factory) -> tuple[Track, Path]:
    out = tmp_path_factory.mktemp("track")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = ck.track(series, tokens=tokens, out=out, progress=False)
    finally:
        torch.set_num_threads(threads)
    return result, out


def _dense_icl(directory: Path, tokens: TokenBatch) -> float:
    """First-copy minus repeated-copy mean cross-entropy from the saved weights (a plain forward pass)."""
    from safetensors.torch import load_file

    state = load_file(str(directory / "model.safetensors"))
    with torch.no_grad():
        logits = _dense_attention_only_logits(state, tokens.tokens, 4)
    logprobs = logits[:, :-1].log_softmax(-1)
    losses = -logprobs.gather(-1, tokens.tokens[:, 1:, None])[..., 0]  # index t-1 predicts token t
    first = losses[:, 1:BLOCK]  # t = 2 .. BLOCK (t = 1 follows the BOS: nothing to copy yet)
    repeated = losses[:, BLOCK + 1 :]  # t = BLOCK + 2 .. 2 BLOCK (t = BLOCK + 1 starts the copy: unpredictable)
    return float(first.mean() - repeated.mean())


# ---------------------------------------------------------------------- the known answer
def test_checkpoints_do_not_change_training(tmp_path):
    """Saving checkpoints only reads the weights: a stopped run ends on the same bytes with and without them."""
    spec = train.SPECS["induction-2l"]
    kwargs = dict(seed=0, steps=spec["steps"], lr=spec["lr"], head_l1=spec["head_l1"], stop=30, log=lambda _: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            train.train_native(tmp_path / "plain", **kwargs)
        with torch.random.fork_rng(devices=[]):
            train.train_native(tmp_path / "saved", checkpoints=tmp_path / "ck", checkpoint_steps=[0, 10, 30], **kwargs)
    finally:
        torch.set_num_threads(threads)
    final = (tmp_path / "plain" / "model.safetensors").read_bytes()
    assert (tmp_path / "saved" / "model.safetensors").read_bytes() == final
    assert (tmp_path / "ck" / "step30" / "model.safetensors").read_bytes() == final
    assert (tmp_path / "ck" / "step0" / "model.safetensors").read_bytes() != final
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step0", "step10", "step30"]


def test_phase_change_agrees_with_a_plain_forward_pass(tracked, series, tokens):
    result, _ = tracked
    icl = [_dense_icl(d, tokens) for d in series]
    steps = [int(d.name.removeprefix("step")) for d in series]
    assert result.steps == steps
    assert result.icl_scores == pytest.approx(icl, abs=ICL_TOL)
    rises = [b - a for a, b in zip(icl, icl[1:], strict=False)]
    expected = steps[rises.index(max(rises)) + 1]
    change = result.phase_change
    assert change["step"] == expected
    assert PHASE_WINDOW[0] <= change["step"] <= PHASE_WINDOW[1]
    assert icl[0] < 0.1 < 4.0 < icl[-1]  # nothing in context at initialisation; ~4 nats once induction works
    assert change["share"] > 3 / (len(steps) - 1)  # abrupt: over 3x the share of a steady rise


def test_named_heads_are_the_documented_heads(tracked):
    change = tracked[0].phase_change
    entry = zoo.info()
    documented_induction = {f"{a}.{b}" for a, b in entry.induction_heads}
    documented_previous = {f"{a}.{b}" for a, b in entry.previous_token_heads}
    assert documented_induction == {"1.0", "1.1", "1.2", "1.3"} and documented_previous == {"0.0", "0.1"}
    assert set(change["heads"]) == documented_induction
    assert set(change["formation"]["induction"]) == documented_induction
    assert set(change["formation"]["previous_token"]) == documented_previous


def test_previous_token_heads_rise_no_later_than_induction_heads(tracked):
    result = tracked[0]
    formed = result.phase_change["formation"]
    first_previous = min(w["rise_at"] for w in formed["previous_token"].values())
    first_induction = min(w["rise_at"] for w in formed["induction"].values())
    assert first_previous <= first_induction
    assert result.phase_change["order"] in ("previous-token first", "together")
    # and the raw scores: before the phase change, no head is called anything
    before = result.checkpoints[result.steps.index(result.phase_change["interval"][0]) - 2]
    assert before["called"] == {"induction": [], "previous_token": []}


def test_track_json_is_to_json_and_the_report_is_offline(tracked):
    result, out = tracked
    data = json.loads((out / "track.json").read_text())
    assert data == json.loads(json.dumps(result.to_json()))
    assert data["format"] == "circuitkit-track/1" and data["circuitkit_version"] == ck.__version__
    assert "nats" in data["units"]["losses"]
    first = data["checkpoints"][0]
    assert {"label", "step", "icl_score", "first_copy_loss", "repeated_loss", "scores"} <= set(first)
    assert len(first["scores"]["induction"]) == 2 and len(first["scores"]["induction"][0]) == 4
    assert first["icl_score"] == pytest.approx(first["first_copy_loss"] - first["repeated_loss"], abs=2e-6)
    assert set(data["phase_change"]) >= {"step", "heads"}
    assert Track.load(out).to_json() == result.to_json()
    page = (out / "report.html").read_text()
    assert "phase change (step" in page and "<svg" in page
    assert 'src="http' not in page and 'href="http' not in page and "<script src" not in page
    assert len(list(out.glob(f"{RECORD_PREFIX}*.json"))) == len(result.checkpoints)


def test_scores_tensor(tracked):
    result = tracked[0]
    induction = result.scores("induction")
    assert induction.shape == (len(result.checkpoints), 2, 4)
    assert float(induction[-1, 1].min()) > 0.8 > 0.1 > float(induction[0].max())
    with pytest.raises(CircuitkitError, match="Track.scores"):
        result.scores("nope")


# ---------------------------------------------------------------------- streaming, resume, merge
def test_interrupted_track_keeps_what_it_finished_and_a_rerun_resumes(series, tokens, tmp_path, monkeypatch):
    chosen = series[::4][:4]
    real = track_run.measure
    calls = []

    def failing(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(track_run, "measure", failing)
    with pytest.raises(KeyboardInterrupt):
        ck.track(chosen, tokens=tokens, out=tmp_path, progress=False)
    data = json.loads((tmp_path / "track.json").read_text())
    assert [c["step"] for c in data["checkpoints"]] == [int(d.name[4:]) for d in chosen[:2]]
    assert data["complete"] is False and (tmp_path / "report.html").is_file()

    counted = []
    monkeypatch.setattr(track_run, "measure", lambda *a, **k: counted.append(1) or real(*a, **k))
    resumed = ck.track(chosen, tokens=tokens, out=tmp_path, progress=False)
    assert len(counted) == 2  # only the two unfinished checkpoints were measured
    assert resumed.complete and resumed.steps == [int(d.name[4:]) for d in chosen]
    assert json.loads((tmp_path / "track.json").read_text())["complete"] is True
    counted.clear()
    ck.track(chosen, tokens=tokens, out=tmp_path, progress=False, resume=False)
    assert len(counted) == 4


def test_merge_assembles_records_written_by_separate_jobs(series, tokens, tracked, tmp_path):
    from circuitkit.cli import main

    chosen = series[::4]
    for part in (chosen[:2], chosen[2:]):  # two "jobs", one output directory
        ck.track(part, tokens=tokens, out=tmp_path, write_track=False, progress=False)
    assert not (tmp_path / "track.json").exists()
    merged = merge(tmp_path)
    full = {r["step"]: r for r in tracked[0].checkpoints}
    assert [r["icl_score"] for r in merged.checkpoints] == [full[s]["icl_score"] for s in merged.steps]
    assert main(["track", "--merge", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "track.json").read_text())["checkpoints"][0]["step"] == 0


def test_merge_refuses_records_of_other_settings(series, tokens, tmp_path):
    ck.track(series[:1], tokens=tokens, out=tmp_path, write_track=False, progress=False)
    ck.track(series[1:2], out=tmp_path, write_track=False, progress=False, top_k=2)
    with pytest.raises(CircuitkitError, match="track merge: checkpoint 'step50'"):
        merge(tmp_path)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("name", "step"), [
    ("step1000", 1000), ("checkpoint-1000", 1000), ("global_step250", 250),
    ("EleutherAI/pythia-70m@step143000", 143000),
    ("runs/x/step_7/", 7), ("final", None), ("step", None), ("1000", None),
])
def test_step_from_name(name, step):
    assert step_from_name(name if "@" not in name else name.rsplit("@", 1)[1]) == step


def test_empty_list_raises():
    with pytest.raises(CircuitkitError, match="track: checkpoints: given .*expected at least one checkpoint"):
        ck.track([])


def test_unreadable_step_raises(series, tmp_path):
    odd = tmp_path / "final"
    shutil.copytree(series[0], odd)
    with pytest.raises(CircuitkitError, match="cannot read the training step of checkpoint 1 .*final.*steps="):
        ck.track([series[0], odd])


def test_duplicate_steps_raise(series):
    with pytest.raises(CircuitkitError, match=r"track: steps: given duplicates \[5\]"):
        ck.track(series[:2], steps=[5, 5])


def test_directory_without_checkpoints_raises(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(CircuitkitError, match="step<N>/ or checkpoint-<N>/ \\(found none\\)"):
        ck.track(tmp_path)


@pytest.mark.parametrize(("change", "field"), [({"d_model": 32, "d_head": 8}, "d_model = 32"),
                                                ({"d_vocab": 50}, "d_vocab = 50")])
def test_mixed_architectures_or_vocabularies_raise(series, change, field):
    from tests.conftest import boot_bridge

    shape = dict(n_layers=2, n_heads=4, d_model=64, d_head=16, d_vocab=64, n_ctx=64, **{})
    shape.update(change)
    other = boot_bridge(**shape)
    with pytest.raises(CircuitkitError, match=f"checkpoint 'b' \\(step 1\\) has .*{field}.*one architecture"):
        ck.track([zoo.load(), other], steps=[0, 1], labels=["a", "b"], progress=False)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from circuitkit.cli import main

    assert main(["track", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("circuitkit: error: ")
    assert main(["track", "--merge", str(tmp_path)]) == 2
    assert main(["track"]) == 2


def test_cli_track_directory(series, tmp_path, capsys):
    from circuitkit.cli import main

    root = tmp_path / "run"
    root.mkdir()
    for d in series[10:13]:
        shutil.copytree(d, root / d.name)
    assert main(["track", str(root), "--out", str(tmp_path / "out"), "--batch", "4"]) == 0
    printed = capsys.readouterr().out
    assert "3 checkpoints, steps 500 to 600" in printed and "wrote" in printed
    data = json.loads((tmp_path / "out" / "track.json").read_text())
    assert [c["step"] for c in data["checkpoints"]] == [500, 550, 600]


def test_checkpoint_steps_choice():
    assert train.checkpoint_steps(10, 4) == [0, 4, 8, 10]
    assert train.checkpoint_steps(10, listed=[10, 0, 5]) == [0, 5, 10]
    with pytest.raises(ValueError, match="outside"):
        train.checkpoint_steps(10, listed=[11])


@pytest.mark.browser
@pytest.mark.slow
def test_png_export_writes_every_figure(tracked, tmp_path):
    """Headless Chromium screenshots each section of the track report (fails in CI without a browser)."""
    from tests.conftest import require_browser

    require_browser()
    saved = tracked[0].save(tmp_path, png=True)
    names = {p.stem for p in saved.pngs}
    assert names == {"summary", "icl", "losses", "induction", "previous_token", "loss_per_position", "checkpoints"}
    for path in saved.pngs:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


# ---------------------------------------------------------------------- hub revisions (Pythia's step branches)
def _cache_revision(cache: Path, repo: str, revision: str, seed: int):
    """A tiny GPT-2 saved as ``repo`` at ``revision`` in a Hugging Face cache laid out like the hub's."""
    from tests.test_models_loading import save_tiny_gpt2

    commit = f"{seed:040d}"
    root = cache / f"models--{repo.replace('/', '--')}"
    model = save_tiny_gpt2(root / "snapshots" / commit, with_tokenizer=True, seed=seed)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return model


def test_hub_revisions_load_from_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    models = {step: _cache_revision(tmp_path, "someone/tiny", f"step{step}", seed) for seed, step in
              enumerate((0, 1000))}
    generator = torch.Generator().manual_seed(0)
    block = torch.rand(2, 39, generator=generator).argsort(dim=-1)[:, :6] + 1
    batch = TokenBatch(tokens=torch.cat([torch.zeros(2, 1, dtype=torch.long), block, block], dim=1), block_len=6,
                       n_repeats=2, bos=0)
    result = ck.track(["someone/tiny@step1000", "someone/tiny@step0"], tokens=batch, progress=False, top_k=2)
    assert result.steps == [0, 1000] and result.labels == ["step0", "step1000"]
    for step, record in zip(result.steps, result.checkpoints, strict=True):  # oracle: Hugging Face's own logits
        with torch.no_grad():
            logits = models[step](batch.tokens).logits
        losses = -logits[:, :-1].log_softmax(-1).gather(-1, batch.tokens[:, 1:, None])[..., 0]
        expected = float(losses[:, 1:6].mean() - losses[:, 7:].mean())
        assert record["icl_score"] == pytest.approx(expected, abs=ICL_TOL)
    with pytest.raises(CircuitkitError, match="someone/tiny@step2000, which is not in the local Hugging Face cache.*"
                                              "allow_download=True"):
        ck.track(["someone/tiny@step2000"], progress=False)


def test_training_script_saves_checkpoints_and_never_overwrites_the_bundle_when_stopped(tmp_path):
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        with torch.random.fork_rng(devices=[]):
            train.main(["--out", str(tmp_path / "zoo"), "--checkpoints", str(tmp_path / "ck"), "--every", "10",
                        "--stop", "20"])
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    saved = tmp_path / "ck" / "induction-2l"
    assert sorted(p.name for p in saved.iterdir()) == ["final", "step0", "step10", "step20"]
    assert not (tmp_path / "zoo").exists()  # a stopped run is not the bundled model
    assert ck.track(saved, progress=False, top_k=0).steps == [0, 10, 20]
    with pytest.raises(SystemExit):
        train.main(["--stop", "20"])  # --stop without --checkpoints: argparse's usage error


def test_user_scores_are_tracked_and_scores_selects(series, tokens):
    """A score registered by the user appears in every record; ``scores=`` keeps the named ones (plus the two the
    phase change needs). Oracle: the user's score (attention two tokens back) read from TransformerLens's cache."""
    from circuitkit import detect
    from circuitkit.tracking import load_checkpoint

    def two_back(ids: torch.Tensor) -> torch.Tensor:
        batch, pos = ids.shape
        return torch.ones(pos, pos, dtype=torch.bool).tril(-2).triu(-2).expand(batch, pos, pos)

    detect.register(detect.pattern_score("two_back_test", short="2bk", description="attention two tokens back",
                                         targets=two_back))
    try:
        result = ck.track(series[-1:], tokens=tokens, scores=["two_back_test"], progress=False, top_k=0)
    finally:
        detect.unregister("two_back_test")
    record = result.checkpoints[0]
    assert set(record["scores"]) == {"two_back_test", "induction", "previous_token"}
    model = load_checkpoint(series[-1])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens.tokens)
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, q, k]
        expected = pattern.diagonal(-2, dim1=-2, dim2=-1).mean(dim=(0, 2))  # every row q >= 2 has one target
        assert record["scores"]["two_back_test"][layer] == pytest.approx(expected.tolist(), abs=1e-5)
    with pytest.raises(CircuitkitError, match="track: scores"):
        ck.track(series[-1:], scores=["no_such_score"])


def test_chart_draws_every_head_and_highlights_the_named_ones(tracked):
    """Track.chart: the report's per-head chart, public (notebooks use it); bad arguments are one-line errors."""
    from circuitkit import CircuitkitError
    from circuitkit.report.track_page import head_chart

    track, _ = tracked
    svg = track.chart("induction", ["1.3"], hline=0.3)
    assert svg == head_chart(track, "induction", ["1.3"], hline=0.3)
    n_heads = track.scores("induction").shape[1] * track.scores("induction").shape[2]
    assert all(f"head {layer}.{head}" in svg for layer in range(2) for head in range(n_heads // 2))
    with pytest.raises(CircuitkitError, match="Track.chart: score"):
        track.chart("no-such-score")
    with pytest.raises(CircuitkitError, match="Track.chart: highlight"):
        track.chart("induction", "1.3")
