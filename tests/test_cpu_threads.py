"""The CLI lets torch's OpenMP threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``) where it can still take
effect, and never overrides a policy the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

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
