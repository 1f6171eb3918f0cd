"""The researcher's metric and answers of several tokens, against hand computation.

Oracles: the model's own forward (no hooks) read at each prompt's last token by hand; the built-in ``logit_diff``
(a function that recomputes it must give the same circuit, figure for figure); the first-token rule for an answer of
several tokens computed from the tokenizer by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.handbuilt.induction import induction_circuit
from circuitkit.tasks import Task, scan_task
from tests.test_tasks import copy_next_task, task_file

EXACT = 1e-5
"""The same float32 logits read in a different order."""


def log_odds(logits, batch):
    """log p(answer) - log p(wrong), first listed of each: a metric none of the built-ins is."""
    logprobs = logits.log_softmax(-1)
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logprobs[rows, batch.answers[:, 0]] - logprobs[rows, batch.wrongs[:, 0]]


def my_logit_diff(logits, batch):
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, batch.answers[:, 0]] - logits[rows, batch.wrongs[:, 0]]


@pytest.fixture(scope="module")
def model():
    return induction_circuit(10, 16).model


def _last_logits(model, tokens, last):
    with torch.no_grad():
        logits = model(tokens)
    return logits[torch.arange(tokens.shape[0]), last]


def test_a_user_metric_equals_its_hand_computation(model):
    task = copy_next_task(n=8)
    result = scan_task(model, task, metric=log_odds, edges=False, n_resamples=20)
    batch = task.tokenize(model)
    for side, values in (("clean", result.clean), ("corrupted", result.corrupted)):
        logprobs = _last_logits(model, getattr(batch, side), batch.last).log_softmax(-1)
        rows = torch.arange(batch.n_pairs)
        expected = logprobs[rows, batch.answers[:, 0]] - logprobs[rows, batch.wrongs[:, 0]]
        torch.testing.assert_close(values, expected, atol=EXACT, rtol=0)
    data = result.to_json()
    assert data["task"]["metric"] == "custom:log_odds" and "custom:log_odds" in result.answer()
    import jsonschema

    from circuitkit import tasks

    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(data, schema)


def test_a_user_function_for_a_built_in_metric_gives_the_same_circuit(model):
    task = copy_next_task(n=8)
    named = scan_task(model, task, target=0.9, n_resamples=20)
    mine = scan_task(model, Task.from_pairs(task.pairs, name="copy-next", metric=my_logit_diff), target=0.9,
                     n_resamples=20)
    assert mine.circuit.heads == named.circuit.heads and mine.circuit.edges == named.circuit.edges
    assert mine.circuit.faithfulness == pytest.approx(named.circuit.faithfulness, abs=EXACT)
    torch.testing.assert_close(mine.scores, named.scores, atol=EXACT, rtol=0)  # EAP-IG: its gradient


@pytest.mark.parametrize("metric, needle", [
    (lambda logits, batch: my_logit_diff(logits, batch).mean(), "one value per pair"),
    (lambda logits, batch: my_logit_diff(logits, batch).detach(), "differentiable"),
    (lambda logits, batch: torch.log(my_logit_diff(logits, batch) * 0 - 1), "non-finite"),
    (lambda logits, batch: batch.no_such_field, "raised AttributeError"),
    (lambda logits, batch: [0.0] * 8, "returned list"),
    (lambda logits, batch: my_logit_diff(logits, batch).long(), "floating tensor"),
], ids=["mean", "detached", "nan", "raises", "list", "integer"])
def test_a_bad_metric_is_one_clear_line(model, metric, needle):
    with pytest.raises(CircuitkitError) as info:
        scan_task(model, copy_next_task(n=8), metric=metric, n_resamples=20)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_metric_that_is_not_a_function_or_a_name_is_refused():
    with pytest.raises(CircuitkitError, match="metric"):
        Task.from_pairs(copy_next_task(n=2).pairs, metric=int)
    with pytest.raises(CircuitkitError, match="metric"):
        Task.from_pairs(copy_next_task(n=2).pairs, metric="accuracy")


def test_answers_of_several_tokens_are_scored_by_their_first_token():
    """Words ``t{i}`` of the bundled model's tokenizer: an answer ``"t5 t9"`` is scored as ``t5``, by hand."""
    from circuitkit import zoo

    model = zoo.load()
    base = copy_next_task(n=6, d_vocab=60)
    word = lambda t: "<bos>" if t == 0 else f"t{t}"  # noqa: E731  (id 0 is the tokenizer's <bos>; there is no t0)
    words = lambda ids: " ".join(word(t) for t in ids)  # noqa: E731
    pairs = [(words(p.clean), words(p.corrupted), f" {word(p.answers[0])} {word(p.wrongs[0])} t3",
              f" {word(p.wrongs[0])}") for p in base.pairs]
    result = scan_task(model, Task.from_pairs(pairs, name="words"), edges=False, n_resamples=20)
    batch = Task.from_pairs(pairs).tokenize(model)
    tokenizer = model.tokenizer
    first = [tokenizer(a, add_special_tokens=False)["input_ids"][0] for _, _, a, _ in pairs]
    assert first == [p.answers[0] for p in base.pairs]
    logits = _last_logits(model, batch.clean, batch.last)
    rows = torch.arange(len(pairs))
    wrong = torch.tensor([p.wrongs[0] for p in base.pairs])
    expected = logits[rows, torch.tensor(first)] - logits[rows, wrong]
    torch.testing.assert_close(result.clean, expected, atol=EXACT, rtol=0)


def test_the_cli_metric_names_agree_with_the_library():
    from circuitkit import cli
    from circuitkit.graph.task import ALIASES, METRIC_NAMES

    assert set(cli.TASK_METRICS) == {*METRIC_NAMES, *ALIASES}


def test_the_cli_reads_the_metric_it_is_given(tmp_path, capsys):
    from circuitkit import cli

    task = copy_next_task(n=8, d_vocab=60)
    path = task_file(task, tmp_path / "copy.jsonl")
    out = tmp_path / "out"
    assert cli.main(["scan", "--task", str(path), "--metric", "prob_diff", "--resamples", "20", "--out",
                     str(out)]) == 0
    data = json.loads((out / "scores.json").read_text())
    assert data["task"]["metric"] == "prob_diff" and data["task"]["units"] == "probability"
    capsys.readouterr()
    assert cli.main(["scan", "--metric", "kl", "--out", str(tmp_path / "i")]) == 2
    assert "--metric" in capsys.readouterr().err


def test_the_induction_scan_takes_no_metric():
    import circuitkit as ck

    with pytest.raises(CircuitkitError, match="metric"):
        ck.scan(None, metric="logit_diff")


def every_position_logprob(logits, batch):
    """The answer's mean log-probability over each prompt's real positions: a metric of every position."""
    logprobs = logits.log_softmax(-1)  # [pair, pos, vocab]
    picked = logprobs.gather(-1, batch.answers[:, None, :1].expand(-1, logits.shape[1], 1))[..., 0]
    real = batch.real.to(logits.dtype)
    return (picked * real).sum(-1) / real.sum(-1)


def _uneven_task(n: int = 8) -> Task:
    """``copy_next_task`` with every other prompt one token shorter: the batch is padded on the right."""
    pairs = [(p.clean[i % 2:], p.corrupted[i % 2:], p.answers, p.wrongs)
             for i, p in enumerate(copy_next_task(n=n).pairs)]
    return Task.from_pairs(pairs, name="copy-next-uneven")


def test_a_metric_of_every_position_equals_its_hand_computation_on_padded_prompts(model):
    """``UserMetric(fn, reads="all")``: ``fn`` gets the logits at every position and the batch's ``real`` mask;
    each pair's value equals ``fn``'s formula on the model's own forward of that prompt alone (no padding)."""
    from circuitkit.tasks import UserMetric

    task = _uneven_task()
    result = scan_task(model, task, metric=UserMetric(every_position_logprob, reads="all"), edges=False,
                       n_resamples=20)
    batch = task.tokenize(model)
    assert len(set(batch.last.tolist())) == 2  # prompts of two lengths, padded
    for side, values in (("clean", result.clean), ("corrupted", result.corrupted)):
        expected = []
        for pair in range(batch.n_pairs):
            tokens = getattr(batch, side)[pair : pair + 1, : int(batch.last[pair]) + 1]
            with torch.no_grad():
                logprobs = model(tokens)[0].log_softmax(-1)
            expected.append(logprobs[:, int(batch.answers[pair, 0])].mean())
        torch.testing.assert_close(values, torch.stack(expected), atol=EXACT, rtol=0)
    assert result.to_json()["task"]["metric"] == "custom:every_position_logprob"


def test_a_metric_of_every_position_runs_every_stage_and_reloads(model, tmp_path):
    """The whole scan (EAP-IG, the node and edge circuits, the held-out pairs) with a metric of every position,
    saved and loaded back equal; the all-patched shortcut (every node from the corrupted prompt gives the
    corrupted run wherever the read positions' tokens agree) is not taken where the prompts differ at a read
    position that is not the last."""
    import circuitkit as ck
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import UserMetric

    task = copy_next_task(n=12)
    metric = UserMetric(every_position_logprob, reads="all")
    result = scan_task(model, task, metric=metric, target=0.9, n_resamples=20)
    assert result.circuit.edges and result.circuit.faithfulness >= 0.9
    saved = result.save(tmp_path)
    loaded = ck.Scan.load(tmp_path)
    assert loaded.to_json() == json.loads(saved.scores.read_text())
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    for reads, shortcut in (("all", False), ("last", True)):  # the prompts differ before their (equal) last token
        runner = TaskRunner(adapter, batch, UserMetric(every_position_logprob if reads == "all" else log_odds,
                                                     reads=reads), mlps=False, ablation="corrupted")
        assert runner.every_node_patched_is_corrupted() is shortcut, reads


def test_where_a_metric_reads_is_checked_and_kept():
    from circuitkit.tasks import UserMetric

    with pytest.raises(CircuitkitError, match="reads.*'last', 'all'"):
        UserMetric(log_odds, reads="middle")
    metric = UserMetric(every_position_logprob, reads="all")
    assert UserMetric(metric).reads == "all" and UserMetric(metric, reads="last").reads == "last"
    assert repr(metric) == "UserMetric(every_position_logprob, reads='all')"
    task = Task.from_pairs(copy_next_task(n=2).pairs, metric=metric)
    assert task.metric.reads == "all" and task.metric.fn is every_position_logprob


def test_a_metric_of_every_position_that_returns_each_position_is_one_clear_line(model):
    from circuitkit.tasks import UserMetric

    with pytest.raises(CircuitkitError) as info:
        scan_task(model, copy_next_task(n=8), metric=UserMetric(lambda logits, batch: logits[..., 0], reads="all"),
                  n_resamples=20)
    assert "one value per pair" in str(info.value) and "[pair, pos, vocab]" not in str(info.value)
