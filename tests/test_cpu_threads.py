"""The CLI and ``import circuitkit`` let torch's OpenMP threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``)
where it can still take effect, and never override a policy the user chose; where torch came first, a scan beside
busy cores warns once, with the fix. Imports are checked in fresh subprocesses (OpenMP reads its environment once)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

from circuitkit import cpu_threads, pipeline

SNIPPET = """
import os, sys
from circuitkit.cli import main
code = main(["scan", "/no/such/model/dir"])
print(code, os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
"""


def _run(env_policy: str | None, preimport_torch: bool = False) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    code = ("import torch\n" if preimport_torch else "") + SNIPPET
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_cli_sets_a_passive_wait_policy_before_torch_loads():
    code, policy, torch_loaded = _run(None)
    assert code == "2"  # the path error, answered before torch is imported
    assert policy == "PASSIVE" and torch_loaded == "False"


def test_a_policy_the_user_chose_is_kept():
    assert _run("ACTIVE")[1] == "ACTIVE"


def test_nothing_is_set_once_torch_is_loaded():
    """OpenMP has read its environment by then: setting the variable would claim an effect it cannot have."""
    assert _run(None, preimport_torch=True)[1] == "None"


# ------------------------------------------------------------------------------------- library use: import circuitkit
IMPORT_ORDER = """
import os, sys
{first}
{second}
print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
"""


def _import(first: str, second: str = "", env_policy: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    code = IMPORT_ORDER.format(first=first, second=second)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_import_circuitkit_before_torch_sets_the_passive_policy_as_the_cli_does():
    assert _import("import circuitkit") == ["PASSIVE", "False"]  # set, and torch not loaded by the import
    assert _import("import circuitkit", "import torch") == ["PASSIVE", "True"]


def test_import_circuitkit_keeps_a_policy_the_user_chose():
    assert _import("import circuitkit", env_policy="ACTIVE")[0] == "ACTIVE"


def test_import_circuitkit_after_torch_sets_nothing():
    assert _import("import torch", "import circuitkit")[0] == "None"


# ------------------------------------------------------------------------------------- after torch: the warning
@pytest.fixture
def fresh_check(monkeypatch):
    """cpu_threads as in a fresh process where torch came first with no policy; its machine readings faked."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(cpu_threads, "_warned", False)
    monkeypatch.setattr(cpu_threads, "_last_check", None)
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    threads = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(threads)


def test_spinning_threads_beside_busy_cores_warn_once_with_the_fix(fresh_check):
    fresh_check.setattr(cpu_threads, "busy_elsewhere", lambda interval=0.1: 2.0)
    torch.set_num_threads(2)
    with pytest.warns(cpu_threads.SpinningThreadsWarning) as caught:
        assert cpu_threads.warn_if_threads_spin()
    message = str(caught[0].message)
    assert caught[0].filename == __file__  # the caller's line, not circuitkit's
    assert "\n" not in message
    assert "torch.set_num_threads(1)" in message and "OMP_WAIT_POLICY=PASSIVE" in message
    fresh_check.setattr(cpu_threads, "_last_check", None)
    assert not cpu_threads.warn_if_threads_spin()  # once per process


@pytest.mark.parametrize(("case", "busy", "threads", "policy"), [
    ("idle machine", 0.2, 2, None),
    ("one thread never spins", 2.0, 1, None),
    ("the user chose a policy", 2.0, 2, "ACTIVE"),
    ("passive policy", 2.0, 2, "PASSIVE"),
])
def test_no_warning_where_threads_do_not_spin_against_other_work(fresh_check, case, busy, threads, policy):
    fresh_check.setattr(cpu_threads, "busy_elsewhere", lambda interval=0.1: busy)
    if policy is not None:
        fresh_check.setenv("OMP_WAIT_POLICY", policy)
    torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not cpu_threads.warn_if_threads_spin(), case


def test_busy_elsewhere_subtracts_this_process_own_work(monkeypatch):
    """Faked clocks: the machine busy on 2 cores' worth, this process on 0.5 of them -> 1.5 cores elsewhere. The
    wall clock is faked too (it moves only when the function sleeps): with the real one, the time between reading a
    faked CPU clock and the wall clock made the figure 1.4964 on a loaded machine."""
    now = [1000.0]
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(cpu_threads.time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    monkeypatch.setattr(cpu_threads, "_machine_busy_seconds", lambda: 2.0 * now[0])
    monkeypatch.setattr(cpu_threads, "_own_cpu_seconds", lambda: 0.5 * now[0])
    assert cpu_threads.busy_elsewhere(0.05) == pytest.approx(1.5, abs=1e-9)
    monkeypatch.undo()
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda interval=0.1: 1.6)
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    assert cpu_threads.free_cores() == 1  # never 0: round(2 - 1.6) = 0 -> 1
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda interval=0.1: 0.3)
    assert cpu_threads.free_cores() == 2


def test_machine_reading_is_real_on_linux():
    """/proc/stat read as busy CPU seconds: positive, and it grows while this process works."""
    before = cpu_threads._machine_busy_seconds()
    if before is None:
        pytest.skip("no /proc/stat on this platform (the load-average fallback is used)")
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    assert cpu_threads._machine_busy_seconds() - before > 0.1
    assert 1 <= cpu_threads.free_cores(0.05) <= cpu_threads.available_cores()


def test_a_scan_checks_for_spinning_threads(monkeypatch, tiny_bridge):
    """The library's scan calls the check (the CLI needs none: it sets the policy before torch loads)."""
    calls = []
    monkeypatch.setattr(pipeline, "warn_if_threads_spin", lambda *a, **k: calls.append(1) or False)
    pipeline.scan(tiny_bridge, circuit=False, ablate="none")
    assert calls == [1]
