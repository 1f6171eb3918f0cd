"""Roles are data: a role over any registered head score reaches the answer, the ablation groups, the JSON and the
reloaded scan with no edit outside its definition; the default roles keep today's labels and keys."""

from __future__ import annotations

import json

import pytest

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, detect, zoo
from circuitkit.detect.roles import (
    DEFAULT_ROLES,
    HEAD_CALL_THRESHOLD,
    TOGETHER,
    Role,
    called_by_score,
    called_heads,
    check_roles,
    group_labels,
    role_groups,
)
from circuitkit.ranking import head_name

TOKENS = RepeatedTokens(batch=8)
NEW_SCORE = "late_induction"
"""A head score registered by this test only: the induction targets, so the bundled model's induction heads are
called by it (the role over it is then not empty)."""
NEW_ROLE = Role("late-induction", NEW_SCORE)


def test_default_roles_name_the_groups_and_keys_the_scan_always_had():
    assert group_labels(DEFAULT_ROLES) == ("induction heads", "previous-token heads", "circuit")
    assert [role.key for role in DEFAULT_ROLES] == ["induction_heads", "previous_token_heads"]
    assert [role.title for role in DEFAULT_ROLES] == ["Induction", "Previous-token"]
    from circuitkit import pipeline

    assert pipeline.ABLATION_GROUPS == ("induction heads", "previous-token heads", "circuit")
    assert pipeline.called_heads is called_heads and pipeline.HEAD_CALL_THRESHOLD == HEAD_CALL_THRESHOLD
    from circuitkit import scan_types

    assert scan_types.Role is Role


def test_groups_follow_the_roles_given():
    called = {"induction": ((1, 0),), "previous_token": ((0, 1), (0, 2)), "duplicate_token": ()}
    roles = (*DEFAULT_ROLES, Role("duplicate-token", "duplicate_token"))
    groups = role_groups(roles, called)
    # a role without called heads gives no group; "circuit" holds every role's heads once, in role order
    assert groups == {"induction heads": ((1, 0),), "previous-token heads": ((0, 1), (0, 2)),
                      TOGETHER: ((1, 0), (0, 1), (0, 2))}
    assert role_groups((Role("copier", "induction"),), called) == {"copier heads": ((1, 0),)}


@pytest.mark.parametrize("roles, message", [
    ([("a", "induction"), ("a", "previous_token")], "distinct role names"),
    ([("a", "induction", "b")], "role names"),
    ([("a", "induction", "a")], "another role"),
    ([42], "Role"),
    ([("", "induction")], "visible character"),
], ids=["duplicate-name", "feeds-unknown", "feeds-itself", "not-a-role", "blank-name"])
def test_bad_roles_are_refused(roles, message):
    with pytest.raises(CircuitkitError, match=message):
        check_roles(roles)


@pytest.fixture(scope="module")
def registered():
    from circuitkit.detect import tokens as token_targets

    detect.register(detect.pattern_score(NEW_SCORE, short="late", description="attention to the token after the "
                                         "previous copy (a test's copy of the induction score)",
                                         targets=token_targets.induction_targets))
    yield NEW_SCORE
    detect.unregister(NEW_SCORE)


@pytest.fixture(scope="module")
def scanned(registered, tmp_path_factory):
    roles = (*DEFAULT_ROLES, NEW_ROLE)
    result = ck.scan(zoo.load(), tokens=TOKENS, roles=roles)
    out = tmp_path_factory.mktemp("roles")
    result.save(out)
    return result, json.loads((out / "scores.json").read_text(encoding="utf-8")), out


def test_a_new_role_is_called_grouped_and_saved(scanned):
    result, data, _ = scanned
    called = called_heads(result.head_scores, NEW_SCORE)
    assert called, "the test score calls no head on the bundled model: the test would prove nothing"
    assert set(called) == set(zoo.info().induction_heads)  # an independent oracle: the documented heads
    assert result.called[NEW_SCORE] == called
    # the ablation groups: its own group ablated together, its heads in the joined group and the exact set
    assert "late-induction heads" in result.circuit_ablation
    assert set(data["circuit_ablation"]) == {"induction heads", "previous-token heads", "late-induction heads",
                                             TOGETHER}
    ablated = {tuple(h) for h in result.ablation.exact.nonzero().tolist()}
    assert set(called) <= ablated
    stage = next(s for s in result.stages if s.name == "ablate")
    assert stage.passes == len(ablated) + 4  # one pass per head ablated exactly, one per group
    # the JSON: its key, its role among the settings; the defaults' keys unchanged
    assert data["late_induction_heads"] == [head_name(h) for h in called]
    assert data["induction_heads"] == [head_name(h) for h in result.induction_heads]
    assert "late-induction: late_induction" in data["settings"]["roles"]


def test_the_report_page_labels_heads_by_every_role(scanned):
    """The page's head detail names a head by each role whose score calls it, the new role included."""
    from circuitkit.report.data import page_data

    result, _, _ = scanned
    data, _ = page_data(result)
    H = result.model.n_heads
    labelled = {entry["role"]: entry["heads"] for entry in data["role_heads"]}
    assert list(labelled) == ["induction head", "previous-token head", "late-induction head"]
    assert labelled["late-induction head"] == [a * H + b for a, b in called_heads(result.head_scores, NEW_SCORE)]
    assert labelled["induction head"] == [a * H + b for a, b in result.induction_heads]


def test_a_new_role_reaches_the_answer(scanned):
    from circuitkit.report.summary import answer_lines, find_answer

    result, _, _ = scanned
    assert result.verified is not None
    given = result.verified.roles
    assert set(given) == {"induction", "previous-token", "late-induction"}
    assert given["late-induction"] == given["induction"]  # the same score, so the same circuit heads
    answer = find_answer(result)
    induction_heads = set(given["induction"])
    assert {h for h, roles in answer.circuit if "late-induction" in roles} == induction_heads
    circuit_line = next(line for line in answer_lines(result) if line.startswith("Circuit:"))
    assert "late-induction" in circuit_line


def test_the_new_role_survives_a_reload_and_the_schema(scanned):
    from importlib.resources import files

    import jsonschema

    result, data, out = scanned
    schema = json.loads(files("circuitkit.report").joinpath("scores.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, schema)
    loaded = ck.Scan.load(out)
    assert loaded.called == dict(result.called)
    assert loaded.to_json() == data


def test_called_by_score_keys_each_score_once():
    class Scores(dict):
        definitions = {"induction": type("D", (), {"neutral": 0.0})()}

    import torch

    scores = Scores(induction=torch.tensor([[0.1, 0.9]]))
    roles = (Role("a", "induction"), Role("b", "induction"))
    assert called_by_score(scores, roles) == {"induction": ((0, 1),)}
