"""`circuitkit.scan`: the pipeline as a library call, the score registry end to end, and the CLI as a thin shell."""

from __future__ import annotations

import json

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, detect, zoo
from circuitkit.cli import main, ranked_table
from tests.conftest import mean_ablated_logits, repeated_copies_loss

TOKENS = RepeatedTokens(batch=8)


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def result(model):
    return ck.scan(model, tokens=TOKENS, name=zoo.DEFAULT)


def test_scan_calls_the_documented_circuit(result):
    entry = zoo.info()
    assert set(result.induction_heads) == set(entry.induction_heads)
    assert set(result.previous_token_heads) >= set(entry.previous_token_heads)


def test_exact_set_contains_the_called_heads(result):
    exact = {tuple(h) for h in result.ablation.exact.nonzero().tolist()}
    assert set(result.induction_heads) | set(result.previous_token_heads) <= exact
    assert torch.isnan(result.ablation.effect[~result.ablation.exact]).all()


def test_one_clean_pass_numbers_equal_the_separate_entry_points(model, result):
    """The scan's single pass gives what head_scores / induction_loss / ablation_effects give on their own."""
    scores = ck.head_scores(model, TOKENS)
    for name in scores:
        torch.testing.assert_close(result.head_scores[name], scores[name])
    loss = ck.induction_loss(model, TOKENS)
    assert result.induction_loss.repeated_copies == pytest.approx(loss.repeated_copies, abs=1e-6)
    heads = [tuple(h) for h in result.ablation.exact.nonzero().tolist()]
    separate = ck.ablation_effects(model, TOKENS, heads=heads)
    torch.testing.assert_close(result.ablation.effect, separate.effect, equal_nan=True, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ablate, n_exact", [("all", 8), ("none", None)])
def test_ablate_modes(model, ablate, n_exact):
    result = ck.scan(model, tokens=RepeatedTokens(batch=2), ablate=ablate, circuit=False)
    if n_exact is None:
        assert result.ablation is None and result.agreement is None
    else:
        assert int(result.ablation.exact.sum()) == n_exact and result.agreement.n_exact == n_exact


def test_top_and_repr(result):
    assert result.top("induction", 1)[0][0] in set(zoo.info().induction_heads)
    assert len(result.top("attribution", 3)) == 3
    assert "induction heads" in repr(result)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ablate="some"), "ablate"),
        (dict(ablate_top=0), "ablate_top"),
        (dict(ablate_top=True), "ablate_top"),
        (dict(ablation_method="resample"), "ablation_method"),
        (dict(top_k=-1), "top_k"),
        (dict(device="nonsense"), "device"),
        (dict(device="meta"), "meta"),
        (dict(name=""), "name"),
    ],
    ids=["ablate", "ablate-top-zero", "ablate-top-bool", "method", "top-k", "device", "meta-device", "empty-name"],
)
def test_bad_arguments(model, kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        ck.scan(model, **kwargs)


# ---------------------------------------------------------------------- the registry, end to end
def two_back_targets(tokens: torch.Tensor) -> torch.Tensor:
    """Query i attends to key i - 2 (i >= 2): a score no library code knows about."""
    pos = tokens.shape[1]
    mask = torch.zeros(pos, pos, dtype=torch.bool)
    idx = torch.arange(2, pos)
    mask[idx, idx - 2] = True
    return mask.expand(tokens.shape[0], pos, pos)


@pytest.fixture()
def two_back():
    definition = detect.register(
        detect.pattern_score(
            "two_back", short="back2", description="attention to the token two positions back",
            targets=two_back_targets,
        )
    )
    yield definition
    detect.unregister("two_back")


def test_a_registered_score_appears_everywhere(two_back, model, tmp_path):
    scores = ck.head_scores(model, RepeatedTokens(batch=2))
    assert "two_back" in scores and scores["two_back"].shape == (2, 4)
    _, cache = model.run_with_cache(scores.tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]  # oracle: mean of pattern[i, i-2] over rows i >= 2
    expected = pattern.diagonal(offset=-2, dim1=-2, dim2=-1).mean(dim=(0, 2))
    torch.testing.assert_close(scores["two_back"][0], expected, atol=1e-5, rtol=0)

    result = ck.scan(model, tokens=RepeatedTokens(batch=2), ablate="none", circuit=False)
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(ranked_table(result))
    assert "back2" in console.export_text()
    saved = result.save(tmp_path)
    assert "two_back" in json.loads(saved.scores.read_text())["head_scores"]
    html = saved.report.read_text()
    assert "back2" in html and "attention to the token two positions back" in html


def test_registry_refuses_duplicates_and_bad_definitions():
    with pytest.raises(CircuitkitError, match="already registered"):
        detect.register(detect.pattern_score("induction", short="x9", description="d", targets=two_back_targets))
    with pytest.raises(CircuitkitError, match="targets"):
        detect.pattern_score("x", short="x", description="d", targets=None)
    with pytest.raises(CircuitkitError, match="score"):
        detect.unregister("no-such-score")


# ---------------------------------------------------------------------- the CLI is a thin shell
@pytest.mark.slow
def test_cli_output_is_byte_identical_to_the_library(tmp_path, capsys):
    cli_dir, lib_dir = tmp_path / "cli", tmp_path / "lib"
    assert main(["scan", "--out", str(cli_dir), "--batch", "4", "--seed", "3"]) == 0
    capsys.readouterr()
    ck.scan(tokens=RepeatedTokens(batch=4, seed=3)).save(lib_dir)
    for name in ("report.html", "scores.json"):
        assert (cli_dir / name).read_bytes() == (lib_dir / name).read_bytes(), name


def test_circuit_ablated_together_equals_hand_written_hooks(model, result):
    """Oracle: replace every called induction head's z by its clean mean with hooks written here."""
    heads = result.induction_heads
    batch = TOKENS.build(model)
    logits = mean_ablated_logits(model, batch.tokens, heads)
    expected = repeated_copies_loss(logits, batch.tokens, batch.repeated_copies) - result.induction_loss.repeated_copies
    assert result.circuit_ablation["induction heads"] == pytest.approx(expected, abs=1e-4)
    assert expected > 3.0  # without its induction heads the model cannot copy: the repeats cost ~ the first copy
    assert set(result.circuit_ablation) == {"induction heads", "previous-token heads", "circuit"}


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_edge_evidence_rides_on_the_attribution_pass_and_equals_circuit_evidence(kv_heads, monkeypatch):
    """The scan's edge attribution takes its clean half from the scan's own attribution pass (one backward of the
    same loss); the table equals a standalone evidence computation on the same batch and composition scores,
    patching the edges between the circuit's heads."""
    from circuitkit.circuits import faithfulness
    from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, context
    from circuitkit.circuits.evidence import evidence_in
    from circuitkit.circuits.metrics import resolve_metric
    from tests.conftest import boot_bridge

    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", n_key_value_heads=kv_heads, seed=7)
    tokens = RepeatedTokens(block_len=6, batch=3, bos=False)
    embedded, searched = [], []
    original = faithfulness.Ablator._pass
    monkeypatch.setattr(faithfulness.Ablator, "_pass", lambda self, ablated: searched.append(1) or original(
        self, ablated))
    handle = model.embed.register_forward_hook(lambda *args: embedded.append(1))
    try:
        result = ck.scan(model, tokens=tokens, ablate="none")
    finally:
        handle.remove()
    # the scan's clean pass with attribution, the circuit search's passes (the joint-path ranking's one stacked
    # pass, the stacked faithfulness passes) and the evidence's corrupted pass; patching resumes mid-model
    # (a random model whose heads together barely move the loss has no circuit: one pass finds that out, the
    # joint-path ranking is not run, and the edge evidence, which serves the circuit, is not computed)
    # edge attribution's integrated path adds its points k = 1 .. steps - 1, stacked in one pass from the embedding;
    # its start, the corrupted input, is kept by the evidence's corrupted pass (no embedding of its own)
    from circuitkit.pipeline import EDGE_ATTRIBUTION_STEPS

    integration = int(EDGE_ATTRIBUTION_STEPS > 1)
    joint = result.verified is not None
    if not joint:
        assert result.circuit is None and len(searched) == 1 and len(embedded) == 1 + len(searched)
        return
    assert result.verified.ranked_by == "joint"
    held_out = 1  # the found circuit on the held-out batch: one stacked pass (circuitkit.circuits.heldout)
    assert result.verified.evaluation["passes"] == 4
    assert len(embedded) == 2 + joint + len(searched) + integration + held_out
    composition = {mode.lower(): scores for mode, scores in result.composition.items()}
    ctx = context(model, tokens, "resample", DEFAULT_CORRUPT_SEED, None, "test")
    alone = evidence_in(ctx, resolve_metric("loss", "test"), composition, result.settings.top_k,
                        result.settings.n_patch, result.verified.heads if joint else None,
                        steps=result.settings.edge_attribution_steps)
    scale = float(alone.attribution.scores.nan_to_num().abs().max())
    torch.testing.assert_close(result.circuit.attribution.scores, alone.attribution.scores, equal_nan=True,
                               atol=1e-5 * scale, rtol=1e-4)
    assert [r.name for r in result.circuit.rows] == [r.name for r in alone.rows]
    torch.testing.assert_close(result.circuit.patching.effects, alone.patching.effects, atol=1e-6, rtol=1e-4)
    if joint:
        members = set(result.verified.heads)
        assert all(e.src in members and e.dst in members for e in result.circuit.patching.edges)


# ---------------------------------------------------------------------- progress that tells the truth
def check_plan_kept(lines: list[str], result) -> list[tuple[int, int, str]]:
    """The stage lines of a ``progress="lines"`` scan keep their word: the plan (announced before the first pass)
    plus every change announced with its reason equals the passes run, stage by stage; passes are integers.
    Returns the changes ``(before, after, why)``."""
    import re

    plan = re.fullmatch(r"scan: (\d+) stages, (\d+) passes planned \((.*)\)", lines[0])
    assert plan, lines[0]
    stages = dict(item.rsplit(" ", 1) for item in plan.group(3).split(", "))
    assert len(stages) == int(plan.group(1))
    total = int(plan.group(2))
    assert total == sum(int(v) for v in stages.values())
    changes = []
    for line in lines[1:]:
        change = re.fullmatch(r"scan: plan (\d+) -> (\d+) passes: (\w+) (\d+) -> (\d+) \((.+)\)", line)
        if change:
            before, after, name, old, new, why = change.groups()
            assert int(before) == total and int(old) == int(stages[name]), line  # each change from the last plan
            total = int(after)
            stages[name] = new
            assert int(after) - int(before) == int(new) - int(old) and len(why) > 10, line
            changes.append((int(before), int(after), why))
    stage_lines = [re.fullmatch(r"scan \[\d+/\d+\] (\w+) +(\d+) pass(es)? +[\d.]+ s", line)
                   for line in lines if line.startswith("scan [")]
    assert all(stage_lines), lines
    ran = {m.group(1): int(m.group(2)) for m in stage_lines}
    assert ran == {s.name: s.passes for s in result.stages}
    assert {name: int(v) for name, v in stages.items() if int(v)} == {n: p for n, p in ran.items() if p}
    assert lines[-1].startswith(f"scan: done, {total} passes in ")
    assert total == sum(s.passes for s in result.stages) and all(isinstance(s.passes, int) for s in result.stages)
    return changes


@pytest.mark.parametrize("ablate", ["top", "all", "none"])
def test_progress_plan_equals_the_stages_run_and_ends_at_the_work_done(model, ablate, capsys):
    """The plan (stage names and passes announced in the first line) is what ran, changed only where announced:
    on the bundled model the only change is the circuit search's size (known when it stops)."""
    from circuitkit.pipeline import stage_plan

    result = ck.scan(model, tokens=RepeatedTokens(batch=2), ablate=ablate, progress="lines")
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines.pop(0) == "scan: preparing the model and the batch"  # printed before anything is loaded
    ran = [stage.name for stage in result.stages]
    assert ran == stage_plan(ablate, True, True)
    changes = check_plan_kept(lines, result)
    assert all(why.startswith("the search measured") for _, _, why in changes), changes
    if ablate == "none":
        assert "ablate" not in ran
    else:  # the ablate stage: one pass per head ablated exactly, one per group of called heads ablated together
        from circuitkit.pipeline import ablation_groups

        heads = [tuple(h) for h in result.ablation.exact.nonzero().tolist()]
        groups = ablation_groups(result.head_scores)
        assert set(groups) == set(result.circuit_ablation)
        stage = next(s for s in result.stages if s.name == "ablate")
        assert stage.passes == len(heads) + len(groups)


@pytest.fixture(scope="module")
def deep_model():
    """A 30-layer x 9-head random-init model (tiny widths: fast), the depth where the old plan went wrong."""
    from tests.conftest import boot_bridge

    return boot_bridge(n_layers=30, n_heads=9, d_model=36, d_head=4, d_vocab=50, n_ctx=32)


def test_progress_plan_keeps_its_word_at_30_layers(deep_model, capsys):
    result = ck.scan(deep_model, tokens=RepeatedTokens(batch=2, block_len=6), progress="lines")
    lines = capsys.readouterr().err.strip().splitlines()[1:]
    changes = check_plan_kept(lines, result)
    # random weights call no induction / previous-token head: the groups are said to be dropped, in words
    assert any("no head is called induction or previous-token" in why for _, _, why in changes), changes


def test_without_a_circuit_the_edge_stage_does_not_run(capsys):
    """A model whose heads write nothing: the search stops at its first pass, and the edge evidence, which only
    serves the circuit, is skipped with the reason said."""
    silent = zoo.load()
    with torch.no_grad():
        for name, param in silent.named_parameters():
            if ".attn." in name and ".o." in name:
                param.zero_()
    result = ck.scan(silent, tokens=RepeatedTokens(batch=2), ablate="none", progress="lines")
    lines = capsys.readouterr().err.strip().splitlines()[1:]
    changes = check_plan_kept(lines, result)
    assert result.verified is None and result.circuit is None
    assert [s.name for s in result.stages] == ["scores", "circuit", "weights"]
    assert any(why.startswith("skipped: no circuit found") for _, _, why in changes), changes
    assert next(s for s in result.stages if s.name == "circuit").passes == 1


def test_progress_bar_total_is_fixed_and_changes_say_why(model):
    import io

    from circuitkit.pipeline import Progress

    stream = io.StringIO()
    bar = Progress("bar", [("scores", 4), ("ablate", 20), ("edges", 5)], stream=stream)
    assert bar.bar.total == 29
    bar.start("scores")
    bar.advance(4)
    bar.end()
    assert bar.bar.total == 29 and bar.bar.n == 4  # as planned: nothing moves
    bar.revise("ablate", 6, "6 heads known now")
    assert bar.bar.total == 15 and "scan: plan 29 -> 15 passes: ablate 20 -> 6 (6 heads known now)" in stream.getvalue()
    bar.start("ablate")
    bar.advance(6)
    bar.end()
    bar.skip("edges", "no circuit found")
    assert bar.bar.n == bar.bar.total == 10 and "edges 5 -> 0 (skipped: no circuit found)" in stream.getvalue()
    assert [(r.stage, r.before, r.after) for r in bar.revisions] == [("ablate", 20, 6), ("edges", 5, 0)]
    bar.close()


def test_non_terminal_cli_prints_stage_lines_and_the_answer(tmp_path, capsys):
    """Without a terminal (pytest captures both streams) the CLI prints one line per stage on stderr, the first at
    once, and after the table the answer: circuit, faithfulness, edges with exact effects, loss."""
    assert main(["scan", "--out", str(tmp_path), "--batch", "4"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0] == "scan: loading induction-2l (the bundled model)"  # before torch and the model load
    assert err[1].startswith("scan: loaded induction-2l in ")
    err = err[2:]
    assert err[0] == "scan: preparing the model and the batch"
    assert err[1].startswith("scan: 5 stages, ") and "planned (scores 4, ablate " in err[1]
    assert sum(line.startswith("scan [") for line in err) == 5
    # not a terminal: nothing hard-wrapped, no trailing spaces (each answer line whole, however long)
    assert all(line == line.rstrip() for line in captured.out.splitlines())
    faithfulness_line = next(line for line in captured.out.splitlines() if line.startswith("Faithfulness:"))
    assert "Necessity:" in faithfulness_line and len(faithfulness_line) > 120
    out = " ".join(captured.out.split())
    for label in ("Circuit:", "Faithfulness:", "Necessity", "Edges: exact effect on the loss, path patching",
                  "Loss: repeated copies"):
        assert label in out, label
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert f"Faithfulness: {scores['circuit']['faithfulness']:.2f}" in out
    assert all(name in out for name in scores["circuit"]["heads"])


def test_cli_ablate_top_default_is_the_library_default():
    from circuitkit.cli import build_parser
    from circuitkit.pipeline import DEFAULT_ABLATE_TOP

    args = build_parser().parse_args(["scan"])
    assert args.ablate_top == DEFAULT_ABLATE_TOP


def test_heads_ablated_together_resume_at_their_first_layer_and_equal_the_full_pass(model):
    """ablate_together resumes from the clean run's residual stream at the first ablated layer; the result equals
    the full forward pass (a clean run without saved residual streams) to float tolerance."""
    from circuitkit.detect.ablation import ablate_together, together_cost
    from circuitkit.detect.clean_run import clean_run
    from circuitkit.detect.tokens import as_batch
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    batch = as_batch(RepeatedTokens(batch=4), adapter)
    saved = clean_run(adapter, batch, z_means=True, resid_layers=[1])
    full = clean_run(adapter, batch, z_means=True)
    heads = [(1, 0), (1, 2)]
    assert together_cost(heads, 2, saved, adapter) == 0.5 and together_cost(heads, 2, full, adapter) == 1.0
    assert together_cost([(0, 1), *heads], 2, saved, adapter) == 1.0
    resumed = ablate_together(adapter, saved, heads, "mean")
    assert resumed == pytest.approx(ablate_together(adapter, full, heads, "mean"), abs=1e-5)
    assert abs(resumed) > 1e-3  # the heads matter: the comparison is not of two zeros
