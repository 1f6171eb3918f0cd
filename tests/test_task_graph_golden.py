"""The task graph's figures do not move when its construction changes: every number a pair-task scan reports on two
tiny models with MLPs (multi-head with MLP nodes; grouped-query with heads only), equal to the figures recorded
before the graph's node types became data (``golden_task_graph.json``, written by this module run as a script).

Equality is exact (to the six decimals ``scores.json`` keeps): the rebuilt graph must run the same operations in
the same order, not only close ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("golden_task_graph.json")
CASES = {"mha-mlp-nodes": dict(kv=None, mlp_nodes=True), "gqa-heads": dict(kv=2, mlp_nodes=False)}


def figures(case: str) -> dict:
    """The scan's ``scores.json`` figures on ``case`` (the timings and the model summary left out)."""
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task, scan_task
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    settings = CASES[case]
    model = boot_bridge(attn_only=False, n_layers=3, n_key_value_heads=settings["kv"], d_vocab=50, seed=3)
    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan = scan_task(adapt(model), task, mlp_nodes=settings["mlp_nodes"], target=0.8, n_resamples=200)
    data = scan.to_json()
    data.pop("model")
    data.pop("settings")  # the options as given (a new option adds a key); the figures are what is pinned
    data.pop("units")  # words about the figures (a loaded scan writes this version's), not figures
    for stage in data["stages"]:
        stage.pop("seconds")
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_figure_equals_the_recorded_one(case):
    recorded = json.loads(GOLDEN.read_text())[case]
    assert figures(case) == recorded


if __name__ == "__main__":  # record the figures (only where the graph is meant to change them)
    GOLDEN.write_text(json.dumps({case: figures(case) for case in sorted(CASES)}, indent=1, sort_keys=True) + "\n")
    sys.exit(0)
