"""Validated attention-head weights: the one type every circuitkit weight analysis consumes.

Why a type of its own: a model's attention weights arrive in many forms (a TransformerLens
``TransformerBridge``, an older ``HookedTransformer``, hand-written tensors, half precision, grouped-query
attention). :class:`HeadWeights` checks them once (shapes, dtypes, finiteness), puts them in one layout,
and every analysis downstream can trust that layout.

Layout (row-vector convention, as TransformerLens: ``x @ W``)::

    W_Q  [layer, head,    d_model, d_head]      b_Q [layer, head,    d_head]
    W_K  [layer, kv_head, d_model, d_head]      b_K [layer, kv_head, d_head]
    W_V  [layer, kv_head, d_model, d_head]      b_V [layer, kv_head, d_head]
    W_O  [layer, head,    d_head,  d_model]     b_O [layer, d_model]
    W_E  [d_vocab, d_model]   W_U [d_model, d_vocab]   W_pos [n_ctx, d_model]   (all optional)

With grouped-query or multi-query attention, ``kv_head < head`` and query head ``h`` reads key/value
group ``h // (head // kv_head)``. The groups are stored once; :meth:`HeadWeights.per_query_head` gives
per-query-head tensors when an analysis needs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.model_state import keeps_model_state

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class HeadWeights:
    """Per-head attention weights of a transformer, validated on construction.

    Build one from tensors (``HeadWeights(W_Q=..., W_K=..., W_V=..., W_O=...)``) or from a model
    (:meth:`from_model`). Half-precision inputs are stored in float32 (analysis is exact by default);
    ``source_dtype`` records what was given. Tensors are detached: no gradients are tracked.

    Shapes are in the module docstring. ``W_K``/``W_V`` (and their biases) may carry fewer heads than
    ``W_Q`` (grouped-query attention) as long as the query heads divide evenly into the groups.
    """

    W_Q: Float[Tensor, "layer head d_model d_head"]
    W_K: Float[Tensor, "layer kv_head d_model d_head"]
    W_V: Float[Tensor, "layer kv_head d_model d_head"]
    W_O: Float[Tensor, "layer head d_head d_model"]
    b_Q: Float[Tensor, "layer head d_head"] | None = None
    b_K: Float[Tensor, "layer kv_head d_head"] | None = None
    b_V: Float[Tensor, "layer kv_head d_head"] | None = None
    b_O: Float[Tensor, "layer d_model"] | None = None
    W_E: Float[Tensor, "d_vocab d_model"] | None = None
    W_U: Float[Tensor, "d_model d_vocab"] | None = None
    W_pos: Float[Tensor, "n_ctx d_model"] | None = None
    source_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        for required in ("W_Q", "W_K", "W_V", "W_O"):
            if getattr(self, required) is None:
                raise validate.fail(f"HeadWeights.{required}", None, "a torch.Tensor (W_Q, W_K, W_V, W_O are required)")
        converted = {}
        dtype = None
        for f in fields(self):
            if f.name == "source_dtype":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if not isinstance(value, Tensor):
                raise validate.fail(
                    f"HeadWeights.{f.name}", value, "a torch.Tensor", "Convert with torch.as_tensor(...)."
                )
            validate.dense(f"HeadWeights.{f.name}", value)
            if value.dtype not in _FLOAT_DTYPES:
                raise validate.fail(
                    f"HeadWeights.{f.name}",
                    validate.given(f"dtype {value.dtype}"),
                    f"a floating dtype (one of {', '.join(str(d) for d in _FLOAT_DTYPES)})",
                    "Cast with .float().",
                )
            if value.numel() == 0:
                raise validate.fail(f"HeadWeights.{f.name}", value, "a non-empty tensor")
            dtype = dtype or value.dtype
            converted[f.name] = value
        source_dtype = self.source_dtype or dtype
        target = _analysis_dtype(converted.values())
        for name, value in converted.items():
            value = value.detach()
            if value.dtype != target:
                value = value.to(target)
            # strided views (a transpose, a slice with a step) of the head tensors are stored contiguous: every
            # analysis reshapes them. W_E / W_U / W_pos only enter matrix products, and a tied W_U is a transposed
            # view of a [d_vocab, d_model] matrix that would cost a copy of the whole vocabulary.
            object.__setattr__(self, name, value if name in _EMBEDDINGS else value.contiguous())
        object.__setattr__(self, "source_dtype", source_dtype)
        self._validate()

    # ------------------------------------------------------------------ shapes
    @property
    def n_layers(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.W_K.shape[1]

    @property
    def group_size(self) -> int:
        """Query heads per key/value group (1 for ordinary multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[2]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[3]

    @property
    def d_vocab(self) -> int | None:
        return None if self.W_E is None else self.W_E.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.W_Q.dtype

    @property
    def device(self) -> torch.device:
        return self.W_Q.device

    @property
    def kv_index(self) -> Tensor:
        """``[head]`` long tensor: the key/value group each query head reads."""
        return torch.arange(self.n_heads, device=self.device) // self.group_size

    def head_names(self) -> list[str]:
        """``["0.0", "0.1", ..., "L.H"]`` in ``(layer, head)`` order, the names used across circuitkit."""
        return [f"{layer}.{head}" for layer in range(self.n_layers) for head in range(self.n_heads)]

    # ------------------------------------------------------------------ views
    def per_query_head(self, name: Literal["W_K", "W_V", "b_K", "b_V"]) -> Tensor:
        """A key/value tensor with one entry per query head: ``[layer, head, ...]``.

        For ordinary attention this is the stored tensor itself; with grouped-query attention the groups
        are repeated (a copy of ``group_size`` times the group's memory, made only when asked for).
        """
        if name not in ("W_K", "W_V", "b_K", "b_V"):
            raise CircuitkitError(
                f"per_query_head: given {name!r}; expected one of 'W_K', 'W_V', 'b_K', 'b_V'."
            )
        value = getattr(self, name)
        if value is None:
            raise CircuitkitError(f"per_query_head: {name} is not set on these HeadWeights.")
        if self.group_size == 1:
            return value
        return value.repeat_interleave(self.group_size, dim=1)

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> HeadWeights:
        """A copy on ``device`` (and in ``dtype`` if given; float16/bfloat16 are promoted to float32).

        ``device`` is checked with :func:`circuitkit.validate.device` (a device that exists here, not ``"meta"``).
        """
        device = validate.device("HeadWeights.to: device", device)
        if dtype is not None and dtype not in _FLOAT_DTYPES:
            raise validate.fail(
                "HeadWeights.to: dtype", dtype, f"None or one of {', '.join(str(d) for d in _FLOAT_DTYPES)}"
            )
        present = self.tensors()
        if all((device is None or value.device == device) and dtype in (None, value.dtype)
               for value in present.values()):
            return self  # frozen and already there: no copy, no second validation
        return replace(self, **{name: value.to(device=device, dtype=dtype) for name, value in present.items()})

    def without_embeddings(self) -> HeadWeights:
        """These weights with ``W_E``, ``W_U`` and ``W_pos`` left out."""
        if self.W_E is None and self.W_U is None and self.W_pos is None:
            return self
        return replace(self, W_E=None, W_U=None, W_pos=None)

    def float(self) -> HeadWeights:
        return self.to(dtype=torch.float32)

    def double(self) -> HeadWeights:
        return self.to(dtype=torch.float64)

    def layers(self, layers: slice | list[int]) -> HeadWeights:
        """The weights of a subset of layers (biases included; embeddings kept as they are)."""
        per_layer = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
        if not isinstance(layers, slice):
            expected = f"a slice or a non-empty list of layer indices in [0, {self.n_layers - 1}]"
            if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
                raise validate.fail("HeadWeights.layers: layers", layers, expected)
            layers = [validate.integer("HeadWeights.layers: layer", layer, minimum=0, maximum=self.n_layers - 1)
                      for layer in validate.bounded_list("HeadWeights.layers: layers", layers, self.n_layers,
                                                         expected, why=f"the model's {self.n_layers} layers")]
            if not layers:
                raise validate.fail("HeadWeights.layers: layers", layers, expected)
        elif len(range(self.n_layers)[layers]) == 0:
            raise validate.fail("HeadWeights.layers: layers", layers, "a slice that keeps at least one layer")
        picked = {}
        for name in per_layer:
            value = getattr(self, name)
            if value is not None:
                picked[name] = value[layers] if isinstance(layers, slice) else value[list(layers)]
        return replace(self, **picked)

    def tensors(self) -> dict[str, Tensor]:
        """All set tensors by name (for saving with safetensors)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "source_dtype" and getattr(self, f.name) is not None
        }

    def __repr__(self) -> str:
        kv = f", kv_heads={self.n_kv_heads}" if self.group_size > 1 else ""
        extras = [name for name in ("W_E", "W_U", "W_pos") if getattr(self, name) is not None]
        return (
            f"HeadWeights(layers={self.n_layers}, heads={self.n_heads}{kv}, d_model={self.d_model}, "
            f"d_head={self.d_head}, dtype={self.dtype}, device={self.device}"
            + (f", with {'/'.join(extras)}" if extras else "")
            + ")"
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any]) -> HeadWeights:
        """From a mapping such as a safetensors file's contents.

        ``W_Q``, ``W_K``, ``W_V``, ``W_O`` are required; unknown keys are an error. Values may be tensors or
        numpy arrays (converted with ``torch.as_tensor``; numpy is accepted here, not by the constructor).
        """
        if not isinstance(tensors, Mapping):
            raise validate.fail("HeadWeights.from_tensors: tensors", tensors, "a mapping of name -> tensor")
        known = {f.name for f in fields(cls)} - {"source_dtype"}
        keys = list(tensors)
        if not all(isinstance(key, str) for key in keys):
            raise validate.fail("HeadWeights.from_tensors: tensors", validate.given(f"keys {keys!r}"), "string keys")
        unknown = sorted(set(keys) - known)
        if unknown:
            raise CircuitkitError(
                f"HeadWeights.from_tensors: given unknown keys {unknown}; expected a subset of {sorted(known)}."
            )
        missing = [name for name in _REQUIRED if name not in tensors]
        if missing:
            raise CircuitkitError(
                f"HeadWeights.from_tensors: given keys {sorted(keys)}; expected the required weights "
                f"{', '.join(_REQUIRED)} (missing {', '.join(missing)})."
            )
        values = {}
        for name, value in tensors.items():
            if value is not None and not isinstance(value, Tensor):
                value = validate.tensor(f"HeadWeights.from_tensors: {name}", value, convert=True)
            values[name] = value
        return cls(**values)

    @classmethod
    @keeps_model_state
    def from_model(cls, model: Any, *, embeddings: bool = True) -> HeadWeights:
        """Read the attention weights of a TransformerLens model (or any object shaped like one).

        Accepts a ``TransformerBridge`` (TransformerLens 4.x), a ``HookedTransformer`` (3.x), a circuitkit
        toy model, or any object with ``W_Q``, ``W_K``, ``W_V``, ``W_O`` attributes in TransformerLens
        shapes and ``cfg.n_layers`` / ``cfg.n_heads``. Biases and ``W_E``/``W_U``/``W_pos`` are read where
        the model has them; ``embeddings=False`` leaves ``W_E``/``W_U``/``W_pos`` out (on a 50k-token
        vocabulary, reading and checking them costs more than all the attention weights of a small model).
        Models with no attention (no ``W_Q``) raise :class:`CircuitkitError`.
        """
        embeddings = validate.boolean("HeadWeights.from_model: embeddings", embeddings)
        if isinstance(model, HeadWeights):
            return model if embeddings else model.without_embeddings()
        getter = getattr(model, "head_weights", None)
        if callable(getter):
            return getter() if embeddings else getter().without_embeddings()
        cfg = getattr(model, "cfg", None)
        names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
        names += ("W_E", "W_U", "W_pos") if embeddings else ()
        # Each attribute is read once: on a TransformerBridge every one is assembled from the blocks.
        with torch.no_grad(), _offloaded_weights_in(model):
            values = {name: value for name in names if (value := _read(model, name)) is not None}
        missing = [name for name in ("W_Q", "W_K", "W_V", "W_O") if name not in values]
        if missing:
            raise CircuitkitError(
                f"HeadWeights.from_model: given a {type(model).__name__} with no {', '.join(missing)}; "
                "expected a model with attention heads (W_Q, W_K, W_V, W_O in TransformerLens shapes). "
                "Models with no attention layers have no heads to analyse."
            )
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            if not isinstance(values[name], Tensor):
                raise CircuitkitError(
                    f"HeadWeights.from_model: {type(model).__name__}.{name} is {describe(values[name])}; "
                    "expected a tensor."
                )
        values = {name: value for name, value in values.items() if isinstance(value, Tensor)}
        values = _drop_inconsistent_optionals(values)
        weights = cls(**values)
        if cfg is not None:
            n_layers = getattr(cfg, "n_layers", None)
            n_heads = getattr(cfg, "n_heads", None)
            if n_layers is not None and n_layers != weights.n_layers:
                raise CircuitkitError(
                    f"HeadWeights.from_model: cfg.n_layers is {n_layers} but W_Q has {weights.n_layers} layers; "
                    "expected them to agree (hybrid models with non-attention layers are not supported yet)."
                )
            if n_heads is not None and n_heads != weights.n_heads:
                raise CircuitkitError(
                    f"HeadWeights.from_model: cfg.n_heads is {n_heads} but W_Q has {weights.n_heads} heads."
                )
        return weights

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            value = getattr(self, name)
            if value.ndim != 4:
                raise CircuitkitError(
                    f"HeadWeights.{name}: given {describe(value)}; expected 4 dimensions "
                    f"{_EXPECTED[name]}. A single layer needs a leading layer axis: {name}[None]."
                )
        L, H, d_model, d_head = self.W_Q.shape
        G = self.W_K.shape[1]
        expected = {
            "W_K": (L, G, d_model, d_head),
            "W_V": (L, G, d_model, d_head),
            "W_O": (L, H, d_head, d_model),
            "b_Q": (L, H, d_head),
            "b_K": (L, G, d_head),
            "b_V": (L, G, d_head),
            "b_O": (L, d_model),
        }
        for name, shape in expected.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise CircuitkitError(
                    f"HeadWeights.{name}: given {describe(value)}; expected shape {shape} {_EXPECTED[name]} "
                    f"to match W_Q of shape {tuple(self.W_Q.shape)}."
                )
        if min(L, H, d_model, d_head) == 0 or G == 0:
            raise CircuitkitError(f"HeadWeights: given W_Q of shape {tuple(self.W_Q.shape)}; no axis may be empty.")
        if H % G != 0:
            raise CircuitkitError(
                f"HeadWeights: given {H} query heads and {G} key/value heads; expected the query heads to "
                "divide evenly into key/value groups (grouped-query attention)."
            )
        if self.W_E is not None and (self.W_E.ndim != 2 or self.W_E.shape[1] != d_model):
            raise CircuitkitError(
                f"HeadWeights.W_E: given {describe(self.W_E)}; expected shape (d_vocab, {d_model}) [d_vocab d_model]."
            )
        if self.W_U is not None and (self.W_U.ndim != 2 or self.W_U.shape[0] != d_model):
            raise CircuitkitError(
                f"HeadWeights.W_U: given {describe(self.W_U)}; expected shape ({d_model}, d_vocab) [d_model d_vocab]."
            )
        if self.W_pos is not None and (self.W_pos.ndim != 2 or self.W_pos.shape[1] != d_model):
            raise CircuitkitError(
                f"HeadWeights.W_pos: given {describe(self.W_pos)}; expected shape (n_ctx, {d_model})."
            )
        devices = {value.device for value in self.tensors().values()}
        if len(devices) > 1:
            raise CircuitkitError(
                f"HeadWeights: given tensors on several devices {sorted(map(str, devices))}; expected one device."
            )
        for name, value in self.tensors().items():
            if validate.all_finite(value):
                continue
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                bad = (~finite).nonzero()[0].tolist()
                kind = "NaN" if bool(torch.isnan(value).any()) else "inf"
                raise CircuitkitError(
                    f"HeadWeights.{name}: given a tensor with {int((~finite).sum())} non-finite values "
                    f"({kind}, first at index {bad}); expected finite weights. Check the checkpoint or the "
                    "training run that produced it."
                )


_REQUIRED = ("W_Q", "W_K", "W_V", "W_O")
_EMBEDDINGS = ("W_E", "W_U", "W_pos")

_EXPECTED = {
    "W_Q": "[layer head d_model d_head]",
    "W_K": "[layer kv_head d_model d_head]",
    "W_V": "[layer kv_head d_model d_head]",
    "W_O": "[layer head d_head d_model]",
    "b_Q": "[layer head d_head]",
    "b_K": "[layer kv_head d_head]",
    "b_V": "[layer kv_head d_head]",
    "b_O": "[layer d_model]",
}


def _analysis_dtype(values) -> torch.dtype:
    dtypes = {value.dtype for value in values}
    return torch.float64 if dtypes == {torch.float64} else torch.float32


OFFLOAD_READ_PARTS = ("attn", "embed", "unembed", "lm_head", "wte", "wpe", "pos")
"""Modules whose offloaded weights :meth:`HeadWeights.from_model` brings in: attention and (un)embeddings only."""


@contextlib.contextmanager
def _offloaded_weights_in(model: Any) -> Iterator[None]:
    """Bring disk- or CPU-offloaded weights (accelerate ``device_map`` hooks, parameters on ``meta``) of the
    attention and embedding modules into memory while they are read, and let accelerate offload them again
    after. The tensors read keep their own storage, so MLP weights are never loaded and nothing is loaded
    twice. A no-op for models without offloaded modules."""
    modules = getattr(model, "named_modules", None)
    offloaded = []
    if callable(modules):
        try:
            from accelerate.utils import align_module_device, has_offloaded_params
        except ImportError:  # accelerate absent: nothing can be offloaded
            align_module_device = has_offloaded_params = None
        if has_offloaded_params is not None:
            offloaded = [
                m for name, m in modules()
                if has_offloaded_params(m) and any(part in name.split(".")[-1] or part in name for part in
                                                   OFFLOAD_READ_PARTS)
            ]
    with contextlib.ExitStack() as stack:
        for module in offloaded:
            stack.enter_context(align_module_device(module, torch.device("cpu")))
        yield


def _read(model: Any, name: str) -> Any:
    """``model.name`` detached, or None where the model has no such attribute (or cannot assemble it)."""
    try:
        value = getattr(model, name)
    except Exception:  # AttributeError, or a property that fails to assemble the tensor: treat as absent
        return None
    return value.detach() if isinstance(value, Tensor) else value


def _drop_inconsistent_optionals(values: dict[str, Any]) -> dict[str, Any]:
    """Keep only optional tensors whose shapes fit; models differ in how they store biases.

    Required weights are never dropped; a bias or embedding stored in an unexpected layout (for example
    a model with no bias returning zeros of another shape) is left out rather than guessed at.
    """
    W_Q, W_K = values["W_Q"], values["W_K"]
    if W_Q.ndim != 4 or W_K.ndim != 4:
        return values
    L, H, d_model, d_head = W_Q.shape
    G = W_K.shape[1]
    shapes = {"b_Q": (L, H, d_head), "b_K": (L, G, d_head), "b_V": (L, G, d_head), "b_O": (L, d_model)}
    kept = dict(values)
    for name, shape in shapes.items():
        if name in kept and tuple(kept[name].shape) != shape:
            del kept[name]
    for name, axis in (("W_E", 1), ("W_U", 0), ("W_pos", 1)):
        if name in kept and (kept[name].ndim != 2 or kept[name].shape[axis] != d_model):
            del kept[name]
    return kept


def as_head_weights(weights: Any, where: str) -> HeadWeights:
    """``weights`` as :class:`HeadWeights` (a model is read with :meth:`HeadWeights.from_model`).

    ``where`` names the caller in the error (e.g. ``"composition_scores"``). Raw tensors, ``None``, numbers,
    strings and containers are refused with a :class:`CircuitkitError`; so is a model whose weights cannot be read.
    """
    if isinstance(weights, HeadWeights):
        return weights
    if weights is None or isinstance(weights, (Tensor, str, bytes, int, float, complex, Mapping, list, tuple)):
        raise validate.fail(
            f"{where}: weights",
            weights,
            "HeadWeights or a model with W_Q/W_K/W_V/W_O",
            "Wrap raw tensors with HeadWeights(W_Q=..., W_K=..., W_V=..., W_O=...) or HeadWeights.from_tensors.",
        )
    return HeadWeights.from_model(weights)
