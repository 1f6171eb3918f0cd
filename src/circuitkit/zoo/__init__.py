"""Bundled known-answer models: small transformers whose induction circuits are documented and tested.

Why: detection needs ground truth. Each model here was trained by :mod:`circuitkit.zoo.train` (deterministic,
under a minute on 2 CPU cores) on random token blocks repeated twice, until induction heads formed. Its
previous-token and induction heads are recorded in :func:`info` and confirmed by ablation in the tests.

- ``"induction-2l"``: 2 layers x 4 heads, attention only, no LayerNorm, d_model 64, d_head 16, vocab 64,
  context 64. A TransformerLens-native model loaded into a ``TransformerBridge``, or with
  ``load(bridge=False)`` into circuitkit's :class:`~circuitkit.models.AttentionOnlyModel` (the same function,
  loaded without TransformerLens: ``circuitkit scan`` on the bundled model runs it so).

Entries whose ``format`` is ``"hf-gpt2"`` would load through :func:`circuitkit.load_model` (the offline
Hugging Face path of :mod:`circuitkit.models.loading`); none is bundled yet.

Token id 0 is the BOS token ``"<bos>"``; id ``i`` is the word ``"t{i}"`` in the bundled tokenizers.
Each model directory holds its weights (``model.safetensors``), its config, its tokenizer, ``zoo.json`` (this
entry) and ``curve.json`` (the training curve: first- and repeated-copy loss every few steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError

if TYPE_CHECKING:  # torch loads with a model, not with the zoo's names (the CLI reads them first)
    import torch

DEFAULT = "induction-2l"
ROOT = Path(__file__).parent


@dataclass(frozen=True)
class ZooEntry:
    """A bundled model: what it is, and the heads its training produced (``(layer, head)``)."""

    name: str
    description: str
    induction_heads: tuple[tuple[int, int], ...]
    previous_token_heads: tuple[tuple[int, int], ...]
    format: str = "tl-native"
    path: Path | None = None


def available() -> list[str]:
    """Names of the bundled models."""
    return sorted(p.parent.name for p in ROOT.glob("*/zoo.json"))


def info(name: str = DEFAULT) -> ZooEntry:
    """The :class:`ZooEntry` of a bundled model."""
    directory = _directory(name)
    data = json.loads((directory / "zoo.json").read_text())
    return ZooEntry(
        name=name,
        description=data["description"],
        induction_heads=tuple(tuple(h) for h in data["induction_heads"]),
        previous_token_heads=tuple(tuple(h) for h in data["previous_token_heads"]),
        format=data["format"],
        path=directory,
    )


def curve(name: str = DEFAULT) -> dict[str, Any]:
    """The training curve of a bundled model: ``{"step": [...], "first_half": [...], "repeated_half": [...]}``."""
    return json.loads((_directory(name) / "curve.json").read_text())


def load(name: str = DEFAULT, *, device: str | torch.device | None = None, bridge: bool = True):
    """Load a bundled model (offline), in eval mode: a TransformerLens ``TransformerBridge`` (default, in
    seconds), or with ``bridge=False`` the same weights as a circuitkit
    :class:`~circuitkit.models.AttentionOnlyModel` (a tenth of a second, without importing TransformerLens or
    transformers; every scan figure equal to the bridge's to float rounding; ``model.tokenizer`` decodes and
    names the BOS, but does not encode text)."""
    entry = info(name)
    device = validate.device("zoo.load: device", device)
    if not validate.boolean("zoo.load: bridge", bridge):
        if entry.format != "tl-native":
            raise CircuitkitError(f"zoo.load: {name!r} has format {entry.format!r}; bridge=False loads only "
                                  "the 'tl-native' attention-only models.")
        return _load_attention_only(entry.path, device)
    loader = _LOADERS.get(entry.format)
    if loader is None:
        raise CircuitkitError(
            f"zoo: {name!r} has format {entry.format!r}; expected one of {sorted(_LOADERS)} for zoo.load. "
            "Load Hugging Face formats with circuitkit.load_model(name)."
        )
    model = loader(entry.path, device)
    model.eval()
    return model


def _directory(name: str) -> Path:
    if not isinstance(name, str) or name not in available():  # exact names only: no '../' reaches outside the zoo
        raise CircuitkitError(f"zoo: given {name!r}; expected one of {available()}.")
    return ROOT / name


def native_config(directory: Path) -> dict[str, Any]:
    """The TransformerLens config (``tl_config.json``) of a bundled model directory (``info(name).path``)."""
    if not isinstance(directory, (str, Path)) or not str(directory) or "\0" in str(directory):
        raise validate.fail("zoo.native_config: directory", directory, "a bundled model directory, info(name).path")
    path = Path(directory) / "tl_config.json"
    if not path.is_file():
        raise validate.fail("zoo.native_config: directory", directory, "a directory holding tl_config.json")
    return json.loads(path.read_text())


def _load_native(directory: Path, device):
    """A TL-native model from ``tl_config.json`` and ``model.safetensors``, built with TransformerLens's public
    ``native.boot`` and its parameters then overwritten with the saved ones (every name must match)."""
    import torch
    from safetensors.torch import load_file

    from circuitkit.models.bridge import native_bridge
    from circuitkit.models.tokenizer import load_tokenizer

    with torch.random.fork_rng(devices=[]):  # nn.Linear's default init would move the caller's random stream
        bridge = native_bridge(tokenizer=load_tokenizer(directory), model_name=directory.name,
                               **native_config(directory), init_weights=False)
    _copy_state(bridge.original_model, load_file(str(directory / "model.safetensors")), directory)
    if device is not None:
        bridge = bridge.to(device)
    return bridge


class ZooTokenizer:
    """A bundled model's word-level tokenizer read by the ``tokenizers`` library alone (no transformers): what an
    attention-only bundled model needs, the BOS id and ``decode`` (as Hugging Face's: special tokens kept)."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        from circuitkit.models.files import check_tokenizer_files

        check_tokenizer_files(directory)
        self._tokenizer = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
        bos = json.loads((Path(directory) / "tokenizer_config.json").read_text())["bos_token"]
        self.bos_token_id = self._tokenizer.token_to_id(bos)
        if not isinstance(self.bos_token_id, int):
            raise CircuitkitError(f"zoo: {Path(directory).name!r}: the BOS token {bos!r} is not in its vocabulary.")

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"ZooTokenizer(vocab={self._tokenizer.get_vocab_size()}, bos_token_id={self.bos_token_id})"


def _load_attention_only(directory: Path, device):
    """The TL-native weights as an :class:`AttentionOnlyModel` (the config's fields checked: attention only, no
    norm, learned positions, the default attention scale), its tokenizer prepending BOS as the bridge's does."""
    from safetensors.torch import load_file

    from circuitkit.models.bridge import native_weights
    from circuitkit.models.toy import AttentionOnlyModel

    config = native_config(directory)
    fixed = {"attn_only": True, "normalization_type": None, "positional_embedding_type": "standard"}
    if any(config.get(key) != value for key, value in fixed.items()) or "attn_scale" in config:
        raise CircuitkitError(f"zoo: {directory.name!r} is not an attention-only model without norms "
                              f"({ {key: config.get(key) for key in fixed} }); load it with bridge=True.")
    weights = native_weights(load_file(str(directory / "model.safetensors")), n_layers=config["n_layers"],
                             n_heads=config["n_heads"], n_kv_heads=config.get("n_key_value_heads") or config["n_heads"],
                             d_head=config["d_head"], where=f"zoo: {directory.name!r}")
    model = AttentionOnlyModel(weights, n_ctx=config["n_ctx"], tokenizer=ZooTokenizer(directory),
                               default_prepend_bos=True)
    return model if device is None else model.to(device)


def _copy_state(native: torch.nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    """Copy the saved ``state`` into the freshly booted native model (names and shapes checked)."""
    from circuitkit.models.bridge import load_native_state

    load_native_state(native, state, f"zoo: {directory.name!r}")


_LOADERS = {"tl-native": _load_native}
"""Loaders by ``format``. Hugging Face formats (``"hf-*"``) load through :func:`circuitkit.load_model`, which
owns the Hugging Face path; the zoo imports only the tokenizer helpers, so the loader may import the zoo."""
