"""The model's state is the caller's: every public entry point that takes a model leaves it exactly as it was.

Why: a measurement that runs a model in ``train()`` mode runs it with dropout, so two identical scans differ and
nothing says why; a measurement that leaves a hook behind, flips ``requires_grad`` or moves the model changes the
caller's later work. :func:`keeps_model_state` (a decorator) and :func:`caller_state` (the context manager under
it) give every entry point the same contract:

- inside, every module is in ``eval()`` mode (dropout off: measurements are deterministic and exact);
- afterwards, each module's ``training`` flag, its hook dictionaries (forward, forward-pre, backward,
  state-dict hooks), each parameter's ``requires_grad`` and the device of every parameter and buffer are what they
  were before, also when the call raised or was interrupted;
- ``device=``, where an entry point takes one, means "run there": a model wholly on another device is moved there for
  the call (:func:`place`) and moved back afterwards (with its ``cfg.device``, which TransformerLens reads to place
  the tensors it makes); a model spread over several devices (``device_map``) runs where it is, and a ``device=``
  that differs is refused in one line;
- a model whose weights are on the ``meta`` device (moved there, or offloaded with no way to bring them back) is
  refused with one :class:`~circuitkit.CircuitkitError` line before any work;
- so is a model with a NaN or infinite weight (the line names the parameter): every measurement of it would be
  NaN, or, worse, finite where the bad weight happens not to reach (attention patterns ignore ``W_V``). One sum
  per parameter (:func:`circuitkit.validate.all_finite`), read once per outermost call; buffers are not checked
  (attention masks hold ``-inf`` by design).

A ``TransformerBridge`` installs capture hooks of its own on its first forward pass (once); those are installed
before the state is saved, so they count as the model's own.

Nested entry points (``scan`` calls ``head_scores`` ...) cost nothing: while a call holds the model's state, the
calls inside it leave the model to it (walking a 270M model's 1,500 modules to save and compare their state took
0.1 s per call, and a scan makes ten such calls).

Why at the package's ground floor and not in ``models``: :meth:`circuitkit.HeadWeights.from_model`, which the
models layer builds on, keeps the contract too (``circuitkit.models.state`` names the same functions).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from circuitkit.errors import CircuitkitError

F = TypeVar("F", bound=Callable[..., Any])

HOOK_DICTS = (
    "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
    "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)
"""The per-module hook registries of ``torch.nn.Module`` (those present in the installed torch are saved)."""

__all__ = ["caller_state", "keeps_model_state", "module_of", "place", "settle", "state_of"]


_ABSENT = object()
"""A ``cfg`` with no ``device`` attribute (nothing to restore)."""

_HELD: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("circuitkit_held_models", default=frozenset())
"""``id`` of each module whose state an enclosing :func:`caller_state` will put back."""


def module_of(model: Any) -> torch.nn.Module | None:
    """The ``torch.nn.Module`` behind ``model`` (the model itself, or an adapter's ``.model``), or None."""
    if isinstance(model, torch.nn.Module):
        return model
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, torch.nn.Module) else None


def state_of(module: torch.nn.Module) -> dict[str, Any]:
    """A comparable record of everything :func:`caller_state` promises to restore (no parameter values)."""
    modules = dict(module.named_modules(remove_duplicate=False))
    return {
        "training": {name: m.training for name, m in modules.items()},
        "hooks": {name: {attr: dict(getattr(m, attr)) for attr in HOOK_DICTS if hasattr(m, attr)}
                  for name, m in modules.items()},
        "requires_grad": {name: p.requires_grad for name, p in module.named_parameters(remove_duplicate=False)},
        "devices": {name: t.device for name, t in [*module.named_parameters(remove_duplicate=False),
                                                   *module.named_buffers(remove_duplicate=False)]},
    }


def _refuse_meta(module: torch.nn.Module, where: str) -> None:
    for name, param in module.named_parameters():
        if param.is_meta and not _offloaded(module, name):
            raise CircuitkitError(
                f"{where}: given a model whose weight {name!r} is on the meta device (shapes only, no data); "
                "expected a model with its weights loaded. A model moved with .to('meta') or loaded with "
                "device_map 'disk' entries but no offload_folder cannot be run."
            )


def _refuse_non_finite(module: torch.nn.Module, where: str) -> None:
    from circuitkit.validate import all_finite

    for name, param in module.named_parameters():
        if param.is_meta or all_finite(param.detach()):
            continue
        values = param.detach()
        bad = int((~torch.isfinite(values)).sum())
        kind = "NaN" if bool(torch.isnan(values).any()) else "infinite"
        raise CircuitkitError(
            f"{where}: given a model whose weight {name!r} {tuple(values.shape)} holds {bad} {kind} values; expected "
            "finite weights. Check the checkpoint or the training run that produced it (a loss that diverged, "
            "an overflow in half precision)."
        )


def _offloaded(module: torch.nn.Module, name: str) -> bool:
    """Whether accelerate brings this meta parameter in from disk on use (its module, or one above it, has a
    ``_hf_hook`` with a weights map)."""
    parts = name.split(".")[:-1]
    current = module
    for part in ["", *parts]:
        if part:
            current = getattr(current, part, None)
            if current is None:
                return False
        hook = getattr(current, "_hf_hook", None)
        if hook is not None and (getattr(hook, "weights_map", None) is not None or getattr(hook, "offload", False)):
            return True
    return False


def settle(module: torch.nn.Module) -> None:
    """Let ``module`` do the one-time set-up it would do on its first forward pass: a ``TransformerBridge`` block
    wires capture hooks of its own, once (idempotent). Done before the state is saved, so restoring the hooks
    cannot undo that wiring while the block believes it is in place."""
    for m in module.modules():
        wire = getattr(m, "_maybe_wire_capture_hooks", None)
        if callable(wire):
            wire()


@contextlib.contextmanager
def caller_state(model: Any, where: str = "circuitkit") -> Iterator[None]:
    """Run the block with ``model`` in eval mode; afterwards put back every module's mode, hook dictionaries,
    ``requires_grad`` flags and parameter/buffer devices (see the module docstring). A no-op for objects that are
    not (and do not wrap) a ``torch.nn.Module``."""
    module = module_of(model)
    if module is None or id(module) in _HELD.get():
        yield  # not a module, or an enclosing call restores it
        return
    _refuse_meta(module, where)
    _refuse_non_finite(module, where)
    settle(module)
    modules = list(module.modules())
    modes = [(m, m.training) for m in modules]
    hooks = [(m, attr, dict(getattr(m, attr))) for m in modules for attr in HOOK_DICTS if hasattr(m, attr)]
    grads = [(p, p.requires_grad) for p in module.parameters()]
    places = [(t, t.device) for t in [*module.parameters(), *module.buffers()]]
    # Module.to() moves a parameter in place but puts a new tensor in a buffer's slot: the buffers are put back by
    # slot (the original tensor, which still holds the data where it was)
    slots = [(m, name, buffer) for m in modules for name, buffer in m._buffers.items() if buffer is not None]
    cfg = getattr(module, "cfg", None)
    cfg_device = getattr(cfg, "device", _ABSENT)
    module.eval()
    held = _HELD.set(_HELD.get() | {id(module)})
    try:
        yield
    finally:
        _HELD.reset(held)
        for m, training in modes:
            m.training = training
        for m, attr, saved in hooks:
            live = getattr(m, attr)
            if live != saved:
                live.clear()
                live.update(saved)
        for p, flag in grads:
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        for t, device in places:
            if t.device != device:
                t.data = t.data.to(device)
        for m, name, buffer in slots:
            now = m._buffers.get(name)
            if now is not buffer and (now is None or now.device != buffer.device):
                m._buffers[name] = buffer
        if cfg_device is not _ABSENT and getattr(cfg, "device", _ABSENT) != cfg_device:
            cfg.device = cfg_device


def place(model: Any, device: torch.device, where: str = "circuitkit") -> None:
    """Put ``model`` on ``device`` for the call that holds its state (the ``device=`` rule of the module docstring).

    Nothing moves when every parameter and buffer is already there, or when ``model`` is not a ``torch.nn.Module``
    (a duck-typed model runs where it is; its inputs go to ``device``). A model spread over several devices is
    refused (moving it would undo its placement). Called outside a
    :func:`caller_state` (a bare :func:`~circuitkit.models.adapters.adapt`), the move is the caller's and stays."""
    module = module_of(model)
    if module is None:
        return
    if device.type == "cuda" and device.index is None:  # "cuda" is the current GPU, as tensors report it
        device = torch.device("cuda", torch.cuda.current_device())
    devices = {t.device for t in [*module.parameters(), *module.buffers()]}
    if not devices or devices == {device}:
        return
    if len(devices) > 1:
        spread = ", ".join(sorted(str(d) for d in devices))
        raise CircuitkitError(
            f"{where}: given device={str(device)!r} for a model spread over {spread}; expected no device: a model "
            "placed over several devices (device_map) runs where it is. Leave device out, or load the model on one "
            "device."
        )
    if hasattr(module, "original_model"):  # a TransformerBridge: its own .to() also sets cfg.device
        module.to(device, print_details=False)
    else:
        module.to(device)
        cfg = getattr(module, "cfg", None)
        if cfg is not None and getattr(cfg, "device", None) is not None:
            cfg.device = device if isinstance(cfg.device, torch.device) else str(device)


def keeps_model_state(function: F) -> F:
    """Decorate a public entry point whose argument ``model`` (or first argument) is a model: the call runs under
    :func:`caller_state`."""
    signature = inspect.signature(function)
    names = list(signature.parameters)
    key = "model" if "model" in names else names[0]
    position = names.index(key)
    where = function.__qualname__

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        model = kwargs.get(key, args[position] if len(args) > position else None)
        with caller_state(model, where):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
