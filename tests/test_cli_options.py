"""The scan command's uncertainty and circuit options reach the scan, with their defaults the library's."""

from __future__ import annotations

import json

import pytest

from circuitkit import cli


def test_cli_defaults_are_the_librarys():
    from circuitkit import uncertainty
    from circuitkit.circuits.faithfulness import DEFAULT_TARGET

    args = cli.build_parser().parse_args(["scan"])
    assert args.resamples == uncertainty.DEFAULT_RESAMPLES and args.ci_level == uncertainty.DEFAULT_LEVEL
    assert args.target == DEFAULT_TARGET and args.random_sets == 0 and args.stability == 0


def test_uncertainty_options_reach_the_scan(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["scan", "--out", str(out), "--json", "--resamples", "50", "--ci-level", "0.9", "--random-sets", "2",
            "--stability", "2", "--target", "0.85"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["n_resamples"] == 50 and data["settings"]["ci_level"] == 0.9
    assert data["settings"]["target"] == 0.85 and data["circuit"]["target"] == 0.85
    assert data["circuit"]["random_baseline"] is not None and data["circuit"]["stability"] is not None
    assert data == json.loads((out / "scores.json").read_text())


@pytest.mark.parametrize("argv, needle", [
    (["scan", "--ci-level", "1"], "expected a confidence level in (0, 1)"),
    (["scan", "--resamples", "1"], "--resamples"),
    (["scan", "--stability", "-1"], "--stability"),
])
def test_bad_option_values_are_one_line(argv, needle, tmp_path, capsys):
    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
