"""Bundled known-answer models: small transformers whose induction circuits are documented and tested.

Why: detection needs ground truth. Each model here was trained by :mod:`circuitkit.zoo.train` (deterministic,
under a minute on 2 CPU cores) on random token blocks repeated twice, until induction heads formed. Its
previous-token and induction heads are recorded in :func:`info` and confirmed by ablation in the tests.

- ``"induction-2l"``: 2 layers x 4 heads, attention only, no LayerNorm, d_model 64, d_head 16, vocab 64,
  context 64. A TransformerLens-native model loaded into a ``TransformerBridge``.

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


def load(name: str = DEFAULT, *, device: str | torch.device | None = None):
    """Load a bundled model as a TransformerLens ``TransformerBridge`` (offline, in seconds), in eval mode."""
    entry = info(name)
    device = validate.device("zoo.load: device", device)
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


def _copy_state(native: torch.nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    """Copy the saved ``state`` into the freshly booted native model (names and shapes checked)."""
    from circuitkit.models.bridge import load_native_state

    load_native_state(native, state, f"zoo: {directory.name!r}")


_LOADERS = {"tl-native": _load_native}
"""Loaders by ``format``. Hugging Face formats (``"hf-*"``) load through :func:`circuitkit.load_model`, which
owns the Hugging Face path; the zoo imports only the tokenizer helpers, so the loader may import the zoo."""
