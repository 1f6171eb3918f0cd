"""load_model fetches nothing it was not asked to, runs no code shipped with a model, reads only safetensors, and
answers every malformed directory, bad device and bad name with one CircuitkitError line.

Each guard has a control that shows the test can fail: the socket guard records a direct lookup, the
remote-code sentinel is written when the module is imported, the pickle payload runs under a plain
unpickle, and TransformerLens asked directly (without circuitkit's offline guard) does reach out."""

from __future__ import annotations

import importlib.util
import io
import json
import pickle
import socket
import sys
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.models import load_model
from circuitkit.models.loading import hub_offline, inspect_directory
from circuitkit.models.tokenizer import word_tokenizer_files

LOGIT_TOL = 1e-4
"""Same HF modules, eager attention, float32: agreement to ~1e-7, with a margin."""
VOCAB = 40
REPO = "circuitkit-test/tiny-gpt2"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def save_tiny_gpt2(directory: Path, *, seed: int = 0, with_tokenizer: bool = True):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(str(directory), safe_serialization=True)
    if with_tokenizer:
        word_tokenizer_files(VOCAB, directory)
    return model


def tokens() -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- nothing fetched: a socket guard


class SocketGuard:
    """Records every non-loopback connection attempt and DNS lookup and refuses it (OSError, as a dead network
    would); loopback passes through untouched."""

    LOOPBACK = ("localhost", "127.0.0.1", "::1", "")

    def __init__(self, monkeypatch):
        self.attempts: list[str] = []
        real_connect, real_create = socket.socket.connect, socket.create_connection
        real_getaddrinfo = socket.getaddrinfo

        def local(host) -> bool:
            return str(host) in self.LOOPBACK or str(host).startswith("127.")

        def connect(sock, address, *args):
            host = address[0] if isinstance(address, tuple) else address
            if sock.family == socket.AF_UNIX or local(host):
                return real_connect(sock, address, *args)
            self.attempts.append(f"connect {address}")
            raise OSError("circuitkit test: network refused")

        def create_connection(address, *args, **kwargs):
            if local(address[0]):
                return real_create(address, *args, **kwargs)
            self.attempts.append(f"create_connection {address}")
            raise OSError("circuitkit test: network refused")

        def getaddrinfo(host, *args, **kwargs):
            if local(host):
                return real_getaddrinfo(host, *args, **kwargs)
            self.attempts.append(f"getaddrinfo {host}")
            raise socket.gaierror("circuitkit test: DNS refused")

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket, "create_connection", create_connection)
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in tmp_path, with the hub client ONLINE as far as the environment goes, so
    only circuitkit's own offline guard can keep it from the network."""
    import huggingface_hub.constants as hub_constants

    cache = tmp_path / "hf-home" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    return cache


def cache_model(cache: Path, repo: str = REPO, **kwargs):
    """Save a tiny GPT-2 into the standard hub cache layout: models--org--name/{refs/main, snapshots/REV/}."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REVISION)
    return save_tiny_gpt2(snapshot, **kwargs), snapshot


@pytest.mark.parametrize("with_tokenizer", [True, False], ids=["cached-tokenizer", "generated-tokenizer"])
def test_cached_hub_name_loads_with_zero_connections(hub_cache, monkeypatch, with_tokenizer):
    import huggingface_hub.constants as hub_constants

    hf, _ = cache_model(hub_cache, with_tokenizer=with_tokenizer)
    guard = SocketGuard(monkeypatch)
    bridge = load_model(REPO)
    assert guard.attempts == []
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens()), hf(tokens()).logits, atol=LOGIT_TOL, rtol=0)
    # the offline switch was for the duration of the call only
    assert hub_constants.HF_HUB_OFFLINE is False
    import os

    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ


def test_socket_guard_records_what_it_refuses(monkeypatch):
    guard = SocketGuard(monkeypatch)
    with pytest.raises(OSError):
        socket.getaddrinfo("huggingface.co", 443)
    with pytest.raises(OSError):
        socket.create_connection(("huggingface.co", 443))
    assert len(guard.attempts) == 2


def test_control_transformer_lens_asked_directly_reaches_for_the_hub(hub_cache, monkeypatch):
    """Without circuitkit's offline guard the same cached load tries the network: the zero above means something."""
    from transformer_lens.model_bridge import TransformerBridge

    from circuitkit.models.tokenizer import word_tokenizer

    cache_model(hub_cache)
    guard = SocketGuard(monkeypatch)
    try:
        TransformerBridge.boot_transformers(REPO, tokenizer=word_tokenizer(VOCAB), device="cpu")
    except Exception:  # refused connections may or may not be fatal to it; the attempt is what counts
        pass
    assert guard.attempts, "expected transformers to contact the hub when it is not forced offline"


def test_uncached_name_fails_at_once_without_the_network(hub_cache, monkeypatch):
    guard = SocketGuard(monkeypatch)
    with pytest.raises(CircuitkitError) as info:
        load_model("nobody/no-such-model-circuitkit")
    message = str(info.value)
    assert "\n" not in message and "no-such-model-circuitkit" in message and "allow_download=True" in message
    assert guard.attempts == []


def test_hub_offline_restores_what_was_there(monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    import os

    with pytest.raises(RuntimeError), hub_offline():
        assert hub_constants.HF_HUB_OFFLINE is True and os.environ["TRANSFORMERS_OFFLINE"] == "1"
        raise RuntimeError("leaving the block by an exception restores too")
    assert hub_constants.HF_HUB_OFFLINE is False
    assert os.environ["HF_HUB_OFFLINE"] == "0" and "TRANSFORMERS_OFFLINE" not in os.environ


# ---------------------------------------------------------------- never a model's own code

EVIL_MODULE = """
from pathlib import Path
Path({sentinel!r}).write_text("custom code ran")
"""


class NoStdin(io.TextIOBase):
    """stdin that fails the test if anything tries to ask the user (transformers' "run the custom code?")."""

    def read(self, *args):
        raise AssertionError("load_model read stdin (a prompt was shown)")

    readline = read

    def isatty(self):
        return True  # look interactive, so a prompt would be attempted if the code path existed


def write_custom_code_model(directory: Path, sentinel: Path, *, in_tokenizer_config: bool = False):
    save_tiny_gpt2(directory)
    (directory / "modeling_evil.py").write_text(EVIL_MODULE.format(sentinel=str(sentinel)))
    name = "tokenizer_config.json" if in_tokenizer_config else "config.json"
    data = json.loads((directory / name).read_text())
    data["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel",
                        "AutoTokenizer": ["modeling_evil.EvilTokenizer", None]}
    (directory / name).write_text(json.dumps(data))


@pytest.fixture
def no_prompt(monkeypatch):
    monkeypatch.setattr(sys, "stdin", NoStdin())

    def no_input(*args):
        raise AssertionError("load_model called input() (a prompt was shown)")

    monkeypatch.setattr("builtins.input", no_input)


@pytest.mark.parametrize("in_tokenizer_config", [False, True], ids=["config-auto_map", "tokenizer-auto_map"])
def test_directory_needing_custom_code_is_refused_before_transformers(tmp_path, no_prompt, in_tokenizer_config):
    sentinel = tmp_path / "SENTINEL"
    write_custom_code_model(tmp_path / "model", sentinel, in_tokenizer_config=in_tokenizer_config)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path / "model"))
    message = str(info.value)
    assert "\n" not in message and "custom code" in message and "auto_map" in message
    assert not sentinel.exists()


def test_cached_repo_needing_custom_code_is_refused(hub_cache, monkeypatch, no_prompt, tmp_path):
    sentinel = tmp_path / "SENTINEL"
    _, snapshot = cache_model(hub_cache)
    (snapshot / "modeling_evil.py").write_text(EVIL_MODULE.format(sentinel=str(sentinel)))
    config = json.loads((snapshot / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (snapshot / "config.json").write_text(json.dumps(config))
    guard = SocketGuard(monkeypatch)
    with pytest.raises(CircuitkitError, match="custom code"):
        load_model(REPO)
    assert not sentinel.exists() and guard.attempts == []


def test_control_the_custom_code_sentinel_fires_when_imported(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    write_custom_code_model(tmp_path / "model", sentinel)
    spec = importlib.util.spec_from_file_location("modeling_evil", tmp_path / "model" / "modeling_evil.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert sentinel.exists()


# ---------------------------------------------------------------- only safetensors


class Payload:
    """Unpickling this runs ``Path(sentinel).write_text(...)``: what a hostile pytorch_model.bin can do."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.write_text, (Path(self.sentinel), "pickle code ran"))


def write_pickle_only_model(directory: Path, sentinel: Path):
    save_tiny_gpt2(directory)
    (directory / "model.safetensors").unlink()
    with open(directory / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"transformer.wte.weight": Payload(sentinel)}, handle)


def test_pickle_only_directory_is_refused_and_nothing_is_unpickled(tmp_path, no_prompt):
    sentinel = tmp_path / "SENTINEL"
    write_pickle_only_model(tmp_path / "model", sentinel)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path / "model"))
    message = str(info.value)
    assert "\n" not in message and "pickle" in message and "safetensors" in message
    assert not sentinel.exists()


def test_control_the_pickle_payload_runs_under_a_plain_load(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    write_pickle_only_model(tmp_path / "model", sentinel)
    pickle.loads((tmp_path / "model" / "pytorch_model.bin").read_bytes())  # what a non-weights_only load does
    assert sentinel.exists()


# ---------------------------------------------------------------- malformed directories: one line each


def _rewrite_config(**changes):
    def apply(directory: Path):
        config = json.loads((directory / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        (directory / "config.json").write_text(json.dumps(config))

    return apply


def _truncate(directory: Path):
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])


def _garbage(directory: Path):
    (directory / "model.safetensors").write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator()
                                                                .manual_seed(0), dtype=torch.uint8).numpy().tobytes())


def _drop_a_tensor(directory: Path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(directory / "model.safetensors"))
    del state["transformer.h.1.mlp.c_fc.weight"]
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _index_naming_a_missing_shard(directory: Path):
    (directory / "model.safetensors").rename(directory / "model-00001-of-00002.safetensors")
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "transformer.wte.weight": "model-00001-of-00002.safetensors",
        "transformer.h.1.attn.c_attn.weight": "model-00002-of-00002.safetensors"}}))


MALFORMED = {
    # case id: (how to break a valid tiny GPT-2 directory, a word the one-line error must contain)
    "missing-config": (lambda d: (d / "config.json").unlink(), "config.json"),
    "empty-config": (lambda d: (d / "config.json").write_text("  \n"), "empty"),
    "non-json-config": (lambda d: (d / "config.json").write_text("{model_type: gpt2"), "not JSON"),
    "config-is-a-list": (lambda d: (d / "config.json").write_text("[1, 2]"), "JSON object"),
    "unknown-model-type": (_rewrite_config(model_type="no-such-architecture"), "model_type"),
    "no-model-type": (_rewrite_config(model_type=None), "model_type"),
    "truncated-safetensors": (_truncate, "safetensors"),
    "garbage-safetensors": (_garbage, "safetensors"),
    "shapes-do-not-fit-config": (_rewrite_config(n_embd=48), "shapes"),
    "more-layers-than-weights": (_rewrite_config(n_layer=3), "lack"),
    "a-tensor-missing": (_drop_a_tensor, "mlp.c_fc.weight"),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), "no weights"),
    "index-names-a-missing-shard": (_index_naming_a_missing_shard, "model-00002-of-00002"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_directory_is_one_error_line(tmp_path, case):
    breaker, word = MALFORMED[case]
    save_tiny_gpt2(tmp_path, with_tokenizer=False)
    breaker(tmp_path)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and word in message and message.startswith("load_model")
    assert info.value.__cause__ is None  # no chained traceback behind the one line


def test_the_valid_directory_the_table_breaks_passes_inspection(tmp_path):
    save_tiny_gpt2(tmp_path, with_tokenizer=False)
    checked = inspect_directory(tmp_path)
    assert checked.config["model_type"] == "gpt2" and [p.name for p in checked.weight_files] == ["model.safetensors"]


def test_a_file_instead_of_a_directory_is_refused(tmp_path):
    save_tiny_gpt2(tmp_path, with_tokenizer=False)
    with pytest.raises(CircuitkitError, match="not a file"):
        load_model(str(tmp_path / "model.safetensors"))


# ---------------------------------------------------------------- devices


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


BAD_DEVICES = {"cuda-without-cuda": "cuda", "nonsense": "nonsense", "meta": "meta", "int": 0, "bool": True,
               "cuda-index-out-of-range": "cuda:7"}


@pytest.mark.parametrize("target", ["zoo", "directory"])
@pytest.mark.parametrize("case", sorted(BAD_DEVICES))
def test_bad_device_is_one_error_line(tmp_path, no_cuda, target, case):
    if target == "directory":
        save_tiny_gpt2(tmp_path, with_tokenizer=False)
    with pytest.raises(CircuitkitError) as info:
        load_model("induction-2l" if target == "zoo" else str(tmp_path), device=BAD_DEVICES[case])
    assert "\n" not in str(info.value) and "device" in str(info.value)


@pytest.mark.parametrize("value", [1, b"gpt2", "", ["induction-2l"]], ids=["int", "bytes", "empty", "list"])
def test_bad_name_is_one_error_line(value):
    with pytest.raises(CircuitkitError, match="name_or_path"):
        load_model(value)


def test_allow_download_must_be_a_bool():
    with pytest.raises(CircuitkitError, match="allow_download"):
        load_model("induction-2l", allow_download="yes")
