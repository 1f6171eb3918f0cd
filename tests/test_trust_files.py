"""Every file of a model directory goes through one guarded reader (circuitkit.models.files): hostile files give one
CircuitkitError line each, never a raw traceback, a hang or a read outside the directory.

Cases: tokenizer files (``{}``, not JSON, not UTF-8, huge junk, vocab.json not JSON, a bogus tokenizer_class),
config.json nested 100k deep, special files (FIFO, device, socket), symlinks out of the directory, a shard index
naming ``../``, over-long names, weights on the meta device, sparse/meta tensors handed to HeadWeights, a zoo name
with ``../``, a zoo name that is also a local model directory, ``flash_attention_2`` in config.json.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.models import files as guarded
from circuitkit.models import load_model
from tests.test_loading_safety import save_tiny_gpt2

ROOT = Path(__file__).resolve().parents[1]
HANG_TIMEOUT_S = 60
"""The FIFO case runs in a child process; before the guard it blocked in open() for ever. A refusal takes a few
seconds (imports included), so a child still running after this long is a hang."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny_gpt2(directory)
    return directory


def _copy(tiny: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny, target)
    return target


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _sparse_junk(path: Path, size: int) -> None:
    with open(path, "wb") as handle:  # a sparse file: size on paper, no disk used
        handle.write(b"\x00junk")
        handle.truncate(size)


def _only_vocab_and_merges(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    (d / "vocab.json").write_text("this is not json")
    (d / "merges.txt").write_text("#version: 0.2\n")


def _bogus_class_without_tokenizer_json(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    _edit_json(d / "tokenizer_config.json", tokenizer_class="NoSuchTokenizerFast")


def _weight_map_escaping(d: Path) -> None:
    outside = d.parent / "elsewhere.safetensors"
    shutil.copy(d / "model.safetensors", outside)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"transformer.wte.weight":
                                                                               "../elsewhere.safetensors"}}))


def _symlink_outside(d: Path) -> None:
    outside = d.parent / "elsewhere.safetensors"
    shutil.move(d / "model.safetensors", outside)
    os.symlink(outside, d / "model.safetensors")


def _socket(d: Path) -> None:
    (d / "tokenizer_config.json").unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(d / "tokenizer_config.json"))
    server.close()


HOSTILE = {
    # case: (how to break a valid directory with a tokenizer, words the one line must contain)
    "tokenizer.json-empty-object": (lambda d: (d / "tokenizer.json").write_text("{}"), "tokenizer.json"),
    "tokenizer.json-not-json": (lambda d: (d / "tokenizer.json").write_text("tokens: [1, 2"), "not JSON"),
    "tokenizer.json-not-utf8": (lambda d: (d / "tokenizer.json").write_bytes(b'{"a": "\xff\xfe"}'), "not UTF-8"),
    "tokenizer.json-300MB-junk": (lambda d: _sparse_junk(d / "tokenizer.json", 300 * 2**20), "MiB"),
    "vocab.json-not-json": (_only_vocab_and_merges, "vocab.json"),
    "bogus-tokenizer_class": (_bogus_class_without_tokenizer_json, "tokenizer"),
    "config.json-100k-deep": (lambda d: (d / "config.json").write_text("[" * 100_000 + "]" * 100_000), "nested"),
    "config.json-deep-inside-object": (lambda d: (d / "config.json").write_text(
        '{"model_type": "gpt2", "x": ' + "{\"a\": " * 200 + "1" + "}" * 200 + "}"), "nested"),
    "config.json-not-utf8": (lambda d: (d / "config.json").write_bytes(b'{"model_type": "gpt\xff"}'), "UTF-8"),
    "config.json-huge": (lambda d: _sparse_junk(d / "config.json", 100 * 2**20), "MiB"),
    "config.json-a-directory": (lambda d: ((d / "config.json").unlink(), (d / "config.json").mkdir()), "directory"),
    "weights-symlink-to-dev-zero": (lambda d: ((d / "model.safetensors").unlink(),
                                               os.symlink("/dev/zero", d / "model.safetensors")), "outside"),
    "weights-symlink-outside": (_symlink_outside, "outside"),
    "weights-dangling-symlink": (lambda d: ((d / "model.safetensors").unlink(),
                                            os.symlink(d / "gone", d / "model.safetensors")), "does not exist"),
    "weight_map-escaping-with-dotdot": (_weight_map_escaping, "outside"),
    "tokenizer_config-a-socket": (_socket, "socket"),
    "generation_config-a-fifo": (lambda d: ((d / "generation_config.json").unlink(missing_ok=True),
                                            os.mkfifo(d / "generation_config.json")), "FIFO"),
    "generation_config-deep": (lambda d: (d / "generation_config.json").write_text("[" * 50_000 + "]" * 50_000),
                               "nested"),
    "flash_attention_2-in-config": (lambda d: _edit_json(d / "config.json", attn_implementation="flash_attention_2"),
                                    "flash_attention_2"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_model_file_is_one_error_line(tiny, tmp_path, case):
    breaker, word = HOSTILE[case]
    directory = _copy(tiny, tmp_path)
    breaker(directory)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(directory))
    message = str(info.value)
    assert "\n" not in message and word in message, message
    assert info.value.__cause__ is None


def test_a_symlink_inside_the_directory_is_followed(tiny, tmp_path):
    directory = _copy(tiny, tmp_path)
    (directory / "model.safetensors").rename(directory / "weights.bin.safetensors.real")
    os.symlink("weights.bin.safetensors.real", directory / "model.safetensors")
    assert guarded.checked_file(directory / "model.safetensors", directory) == directory / "model.safetensors"


def test_hub_snapshot_links_to_blobs_are_inside():
    """Hub snapshots are links to ../../blobs: the repository folder is the boundary, not the snapshot."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        repo = Path(root) / "models--org--name"
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / "abc").write_text("{}")
        snap = repo / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True)
        os.symlink("../../blobs/abc", snap / "config.json")
        assert guarded.read_json(snap / "config.json", snap) == {}


def test_fifo_named_model_safetensors_does_not_hang(tiny, tmp_path):
    """Before the guard, safe_open blocked in open() on the FIFO; the child must now answer with one line."""
    directory = _copy(tiny, tmp_path)
    (directory / "model.safetensors").unlink()
    os.mkfifo(directory / "model.safetensors")
    code = ("from circuitkit.models import load_model\nfrom circuitkit import CircuitkitError\nimport sys\n"
            f"try:\n    load_model({str(directory)!r})\nexcept CircuitkitError as e:\n    print('ERROR', e)\n"
            "    sys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
                              env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_model blocked on a FIFO for {HANG_TIMEOUT_S} s")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "FIFO" in proc.stdout


def test_read_bytes_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(CircuitkitError, match="FIFO"):
        guarded.read_json(tmp_path / "pipe.json", tmp_path)


def test_read_bytes_refuses_a_character_device():
    with pytest.raises(CircuitkitError, match="character device"):
        guarded.read_bytes("/dev/null", "/dev", max_bytes=10)


@pytest.mark.parametrize("path", ["x" * 300, "/tmp/" + "d/" * 3000, "./" + "y" * 256 + "/model"],
                         ids=["name-300", "path-6000", "nested-long-name"])
def test_over_long_model_path_is_one_line(path):
    with pytest.raises(CircuitkitError) as info:
        load_model(path)
    assert "\n" not in str(info.value) and "bytes" in str(info.value) and "Errno" not in str(info.value)


def test_dotdot_zoo_name_is_refused():
    with pytest.raises(CircuitkitError, match="expected one of"):
        ck.zoo.info("../zoo/induction-2l")
    with pytest.raises(CircuitkitError, match="expected one of"):
        ck.zoo.load("induction-2l/../induction-2l")


def test_zoo_name_that_is_also_a_local_model_directory_prefers_the_directory(tiny, tmp_path, monkeypatch):
    shutil.copytree(tiny, tmp_path / "induction-2l")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="loading the directory"):
        model = load_model("induction-2l")
    assert model.cfg.d_vocab == 40  # the tiny GPT-2 (vocab 40), not the bundled model (vocab 64)


def test_zoo_name_without_a_local_directory_is_the_bundled_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_model("induction-2l")
    assert model.cfg.d_vocab == 64


def test_disk_device_map_without_offload_folder_is_one_line(tiny, tmp_path):
    with pytest.raises(CircuitkitError, match="meta device") as info:
        load_model(str(_copy(tiny, tmp_path)), device_map={"": "disk"})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_meta_or_sparse_tensors_in_head_weights_are_one_line(kind):
    from tests.conftest import random_weights

    w = random_weights(1, 2, 8, 4).tensors()
    w["W_Q"] = w["W_Q"].to("meta") if kind == "meta" else w["W_Q"].to_sparse()
    with pytest.raises(CircuitkitError, match="meta device" if kind == "meta" else "dense") as info:
        ck.HeadWeights(**{k: v for k, v in w.items() if k in ("W_Q", "W_K", "W_V", "W_O")})
    assert "\n" not in str(info.value)


def test_model_moved_to_meta_is_one_line():
    model = ck.zoo.load("induction-2l").to("meta")
    with pytest.raises(CircuitkitError, match="meta device") as info:
        ck.HeadWeights.from_model(model)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [__import__("numpy").arange(600.0).reshape(20, 30), torch.zeros(40, 40)],
                         ids=["numpy", "tensor"])
def test_errors_summarise_arrays_instead_of_a_multi_line_repr(value):
    with pytest.raises(CircuitkitError) as info:
        ck.validate.integer("f: x", value)
    message = str(info.value)
    assert "\n" not in message and "shape (20, 30)" in message or "shape (40, 40)" in message
    assert len(message) < 200
