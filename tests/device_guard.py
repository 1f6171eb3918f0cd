"""A guard that finds mixed-device bugs on a machine without a GPU.

Why: a tensor that circuitkit makes without naming its device lands on the CPU. On a CPU-only machine that is where
everything else is, so nothing fails; on a GPU it meets CUDA tensors and the call raises ("Expected all tensors to be
on the same device"). CI has no GPU, so such bugs would only be found on one.

How: :class:`DeviceGuard` is a ``TorchFunctionMode`` (the mechanism ``torch.set_default_device`` itself uses) that
watches every tensor constructor (``torch.tensor``, ``zeros``, ``arange``, ``randint``, ...; the list is torch's own,
``torch.utils._device._device_constructors()``). A constructor called **from circuitkit's own source** without a
``device=`` is recorded with its file and line; the call itself goes on as before (so one run lists every offender).
Constructors called from torch, transformers or TransformerLens are not circuitkit's to fix and are left alone.
``*_like`` functions, ``new_*`` methods and ``.to(...)`` inherit or name a device and are not constructors here.

The rule it holds circuitkit to: every tensor the library makes names its device (``device=x.device``, the session's
``spec.device``, or ``"cpu"`` for a result documented to be on the CPU).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

import circuitkit

PACKAGE = Path(circuitkit.__file__).resolve().parent
"""Where circuitkit's source lives: a constructor called from a file under it is the library's own."""

TORCH = Path(torch.__file__).resolve().parent


@dataclass(frozen=True)
class Offence:
    """One tensor made without a device: the constructor, and where in circuitkit it was called."""

    constructor: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} calls torch.{self.constructor} without device="


@dataclass
class DeviceGuard(TorchFunctionMode):
    """Records (in :attr:`offences`) every tensor constructor circuitkit calls without ``device=``.

    Use as a context manager; :meth:`check` raises an ``AssertionError`` listing the offences."""

    offences: list[Offence] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._constructors = _device_constructors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._constructors and kwargs.get("device") is None and not _inherits_device(func, args):
            where = _circuitkit_caller()
            if where is not None:
                self.offences.append(Offence(func.__name__, *where))
        return func(*args, **kwargs)

    def check(self) -> None:
        if self.offences:
            unique = sorted(set(self.offences), key=lambda o: (o.file, o.line))
            raise AssertionError("tensors made without a device:\n  " + "\n  ".join(map(str, unique)))


def _inherits_device(func, args) -> bool:
    """``torch.as_tensor(t)`` / ``torch.asarray(t)`` of a tensor keep its device: not a new placement."""
    return func in (torch.as_tensor, torch.asarray) and bool(args) and isinstance(args[0], torch.Tensor)


def _circuitkit_caller() -> tuple[str, int] | None:
    """The first frame outside torch and this file: its file (relative to the package) and line when it is
    circuitkit's, else None."""
    frame = sys._getframe(2)
    here = Path(__file__).resolve()
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if path != here and TORCH not in path.parents:
            if PACKAGE in path.parents:
                return str(path.relative_to(PACKAGE.parent)), frame.f_lineno
            return None
        frame = frame.f_back
    return None
