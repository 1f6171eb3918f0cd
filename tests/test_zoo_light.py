"""The bundled model without TransformerLens: ``zoo.load(bridge=False)`` and the CLI's bundled scan.

The oracle is the TransformerLens bridge of the same saved weights (``zoo.load()``): logits, tokens, the BOS rule
and every figure of a scan must agree; the light path must not import TransformerLens or transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import circuitkit as ck
from circuitkit import zoo
from circuitkit.errors import CircuitkitError
from circuitkit.models.bridge import _native_state, native_weights
from circuitkit.models.toy import AttentionOnlyModel
from tests.conftest import assert_close_json


@pytest.fixture(scope="module")
def light():
    return zoo.load(bridge=False)


@pytest.fixture(scope="module")
def bridged():
    return zoo.load()


def _state():
    return load_file(str(zoo.info().path / "model.safetensors"))


def test_the_light_model_computes_the_bridges_logits(light, bridged):
    tokens = torch.randint(0, 64, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(light(tokens), bridged(tokens), atol=2e-5, rtol=1e-5)


def test_the_light_tokenizer_names_every_token_as_the_bridges_does(light, bridged):
    assert light.tokenizer.bos_token_id == bridged.tokenizer.bos_token_id == 0
    assert [light.tokenizer.decode([i]) for i in range(64)] == [bridged.tokenizer.decode([i]) for i in range(64)]
    assert light.cfg.default_prepend_bos is True


def test_a_scan_of_the_light_model_equals_the_bridges_in_every_figure(light, bridged):
    a = ck.scan(light, name="induction-2l").to_json()
    b = ck.scan(bridged, name="induction-2l").to_json()
    assert a["model"].pop("family") == "circuitkit-toy"
    assert b["model"].pop("family") == "transformer-bridge"
    assert_close_json(a, b)
    assert a["circuit"]["heads"] == b["circuit"]["heads"]


def test_native_weights_inverts_the_bridges_layout():
    state = _state()
    w = native_weights(state, n_layers=2, n_heads=4, n_kv_heads=4, d_head=16, where="test")
    back = _native_state(w, 64)
    assert set(back) == set(state)
    for name, value in state.items():
        assert torch.equal(back[name], value), name


@pytest.mark.parametrize("change", ["missing", "extra", "shape"])
def test_native_weights_refuses_a_state_of_another_layout(change):
    state = dict(_state())
    if change == "missing":
        del state["layers.1.attn.v.bias"]
    elif change == "extra":
        state["layers.2.attn.q.weight"] = torch.zeros(64, 64)
    else:
        state["layers.0.attn.k.weight"] = torch.zeros(32, 64)
    with pytest.raises(CircuitkitError, match="test: "):
        native_weights(state, n_layers=2, n_heads=4, n_kv_heads=4, d_head=16, where="test")


def test_a_bos_rule_needs_a_tokenizer_with_a_bos(light):
    with pytest.raises(CircuitkitError, match="bos_token_id"):
        AttentionOnlyModel(light.head_weights(), default_prepend_bos=True)
    with pytest.raises(CircuitkitError, match="default_prepend_bos"):
        AttentionOnlyModel(light.head_weights(), default_prepend_bos="yes")
    for copy in (light.to("cpu"), light.with_attention("hard")):
        assert copy.tokenizer is light.tokenizer and copy.cfg.default_prepend_bos


def test_zoo_load_checks_bridge():
    with pytest.raises(CircuitkitError, match="zoo.load: bridge"):
        zoo.load(bridge="no")


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_light_path_loads_neither_transformer_lens_nor_transformers(tmp_path):
    code = (
        "import json, sys\n"
        "from circuitkit.cli import main\n"
        f"code = main(['scan', '--out', {str(tmp_path / 'out')!r}, '--json'])\n"
        "print()\n"
        "print(json.dumps({'code': code, 'loaded': sorted(m for m in ('transformer_lens', 'transformers') "
        "if m in sys.modules)}))\n"
    )
    result = _run(code)
    assert result == {"code": 0, "loaded": []}
    saved = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert saved["circuit"]["heads"] == ["0.1", "0.0", "1.3", "1.1"]
    assert round(saved["circuit"]["faithfulness"], 3) == 0.871
