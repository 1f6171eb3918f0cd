"""The answer claims only what was measured: where the scan measured no edge between the circuit's heads (a model
family whose heads do not add into the residual stream one by one: ``evidence`` null), the answer says so and why,
in the terminal and in the report alike, instead of "no edge ... carries a measurable effect"."""

from __future__ import annotations

import dataclasses

from circuitkit.report.summary import answer_html, answer_lines, find_answer
from tests.report_fixtures import synthetic_scan

MEASURED_NOTHING = "no edge between the circuit's heads carries a measurable effect"


def _without_edge_stage():
    """A verified circuit of several heads from a scan whose settings measured no edge (``evidence`` null)."""
    scan = synthetic_scan(3, 4, verified=True, circuit=False)
    assert scan.circuit is None and scan.settings.edge_attribution_steps is None and len(scan.verified.heads) > 1
    return scan


def test_unmeasured_edges_are_said_to_be_unmeasured_in_the_terminal_and_the_report():
    scan = _without_edge_stage()
    answer = find_answer(scan)
    for text in (" ".join(answer_lines(scan)), " ".join(answer_html(answer))):
        assert MEASURED_NOTHING not in text
        assert "the edges were not measured" in text and "do not add into the residual stream" in text


def test_a_circuit_in_one_layer_has_no_edge_to_measure():
    scan = _without_edge_stage()
    scan = dataclasses.replace(scan, circuit=synthetic_scan(3, 4, verified=True).circuit,
                               settings=dataclasses.replace(scan.settings, edge_attribution_steps=2),
                               verified=dataclasses.replace(scan.verified, heads=((2, 0), (2, 1))))
    text = " ".join(answer_lines(scan))
    assert MEASURED_NOTHING not in text and "all in one layer" in text


def test_measured_edges_are_still_reported():
    scan = synthetic_scan(3, 4, verified=True)
    answer = find_answer(scan)
    assert answer.edges and answer.edges_unmeasured is None
    assert "path patching" in " ".join(answer_lines(scan))
