"""The one validation layer: every public argument is checked here, and every failure is a ``CircuitkitError``.

Why one module: hand-written checks drift (one accepts ``True`` as an int, another a float seed, a third lets
``nan`` through). Each function below takes the argument's *name* (as the caller spells it, e.g.
``"head_scores: seed"``), the value, and what is allowed; it returns the value normalised (an ``int``, a
``float``, a ``torch.device``) or raises ``CircuitkitError("<name>: given <what>; expected <what>. <fix>")``.

Functions: :func:`integer`, :func:`positive_int`, :func:`real`, :func:`option`, :func:`boolean`,
:func:`seed`, :func:`device`, :func:`tensor`, :func:`finite_result`, :func:`bounded_list` (an iterable, read with
a bound: an endless iterator is refused, never read forever).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Collection, Iterable, Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from circuitkit.errors import CircuitkitError, describe

if TYPE_CHECKING:
    import torch
    from torch import Tensor

MAX_SEED = 2**63 - 1
"""torch.Generator.manual_seed takes seeds up to 2**64 - 1; int64 keeps seeds portable to numpy as well."""


def fail(name: str, given: Any, expected: str, fix: str = "") -> CircuitkitError:
    """The error for argument ``name``: ``"<name>: given <describe(given)>; expected <expected>. <fix>"``."""
    text = given if isinstance(given, _Given) else describe(given)
    message = f"{name}: given {text}; expected {expected}."
    return CircuitkitError(f"{message} {fix}" if fix else message)


class _Given(str):
    """A pre-written description of the given value (passed to :func:`fail` instead of the value)."""


def given(text: str) -> _Given:
    """Mark ``text`` as the description of what was given, for :func:`fail`."""
    return _Given(text)


def bounded_list(name: str, value: Any, limit: int, expected: str, *, why: str = "") -> list:
    """``value`` (a list, tuple, set, generator or any iterator) as a list of at most ``limit`` entries. At most
    ``limit + 1`` entries are read, so an endless iterator (``itertools.count()``, ``itertools.cycle(...)``) is
    refused instead of read forever; an iterator that raises is refused with its error. ``expected`` says what
    the entries are; ``why`` where the bound comes from (e.g. ``"L x H = 48 heads"``)."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise fail(name, value, expected)
    try:
        items = list(itertools.islice(value, limit + 1))
    except Exception as error:  # noqa: BLE001 - the caller's iterator: any error it raises is bad input
        raise fail(name, given(f"an iterable that raised {type(error).__name__}: {_line(error)}"), expected) from None
    if len(items) > limit:
        bound = f" ({why})" if why else ""
        raise fail(name, given(f"more than {limit} entries"), f"{expected}, at most {limit} entries{bound}",
                   "An endless iterator (itertools.count, itertools.cycle) is read only that far; pass a list.")
    return items


def _line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None, why: str = "") -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``. Bools, floats (even ``2.0``) and strings are refused;
    numpy integers are accepted."""
    low = "" if minimum is None else f" >= {minimum}"
    high = "" if maximum is None else f" <= {maximum}"
    joined = f"{low} and{high}" if low and high else low or high
    expected = f"an int{joined}" + (f" ({why})" if why else "")
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise fail(name, value, expected)
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise fail(name, value, expected)
    return value


def positive_int(name: str, value: Any, *, why: str = "") -> int:
    """``value`` as an ``int >= 1``."""
    return integer(name, value, minimum=1, why=why)


def real(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    allow_inf: bool = False,
) -> float:
    """``value`` as a finite ``float`` (``nan`` never; ``inf`` only with ``allow_inf``) within the bounds.
    ``strict_minimum`` makes the lower bound exclusive (``> minimum``)."""
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict_minimum else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    expected = "a finite real number" + (" " + " and ".join(parts) if parts else "")
    if isinstance(value, bool) or not isinstance(value, Real):
        torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
        if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
            value = value.item()
        else:
            raise fail(name, value, expected)
    try:
        value = float(value)
    except OverflowError:  # an int beyond float64 (10**400)
        raise fail(name, value, expected) from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise fail(name, value, expected)
    if minimum is not None and (value < minimum or (strict_minimum and value == minimum)):
        raise fail(name, value, expected)
    if maximum is not None and value > maximum:
        raise fail(name, value, expected)
    return value


def option(name: str, value: Any, options: Collection[str]) -> str:
    """``value`` if it is one of the strings ``options`` (exact match)."""
    choices = ", ".join(repr(o) for o in options)
    if not isinstance(value, str) or value not in options:
        raise fail(name, value, f"one of {choices}")
    return value


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise fail(name, value, "True or False")
    return value


def seed(name: str, value: Any) -> int:
    """A random seed: an int in ``[0, 2**63 - 1]``."""
    return integer(name, value, minimum=0, maximum=MAX_SEED)


DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "fp16": "float16", "half": "float16"}
"""The weight dtypes a model may be loaded in, by the names people write them (values: torch's names)."""


def dtype(name: str, value: Any) -> torch.dtype | None:
    """A floating weight dtype to load a model in: ``torch.float32``, ``torch.bfloat16`` or ``torch.float16``, as a
    ``torch.dtype`` or a name (``"bf16"``, ``"bfloat16"``, ``"fp16"``, ...); ``None`` passes through."""
    import torch

    if value is None:
        return None
    expected = "'float32', 'bfloat16' or 'float16' (or torch.float32 / torch.bfloat16 / torch.float16)"
    if isinstance(value, torch.dtype):
        if value in (torch.float32, torch.bfloat16, torch.float16):
            return value
        raise fail(name, value, expected)
    if isinstance(value, str) and value.strip().lower() in DTYPES:
        return getattr(torch, DTYPES[value.strip().lower()])
    raise fail(name, value, expected)


def device(name: str, value: Any, *, allow_none: bool = True) -> torch.device | None:
    """A device tensors can be put on now: ``"cpu"``, ``"cuda"``/``"cuda:N"`` when that GPU exists, ``"mps"`` when
    available. ``"meta"`` (no data) and devices that do not exist here are refused; ``None`` passes through
    (the model's own device) unless ``allow_none`` is False."""
    import torch

    if value is None:
        if allow_none:
            return None
        raise fail(name, value, "a device such as 'cpu' or 'cuda'")
    expected = "'cpu', 'cuda', 'cuda:N' or a torch.device on this machine"
    if isinstance(value, bool) or not isinstance(value, (str, torch.device)):
        raise fail(name, value, expected, "Pass the device as a string, e.g. device='cpu'.")
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise fail(name, value, expected) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise fail(name, given(f"{value!r}, but CUDA is not available here (no CUDA GPU, or a CPU-only torch)"),
                       "'cpu' or a device this machine has", "Leave the device out or pass 'cpu'.")
        if dev.index is not None and dev.index >= count:
            raise fail(name, given(f"{value!r}, but this machine has {count} CUDA device(s)"),
                       f"one of cuda:0 .. cuda:{count - 1}, or 'cpu'")
        return dev
    if dev.type == "mps":
        backend = getattr(torch.backends, "mps", None)
        if backend is None or not backend.is_available():
            raise fail(name, given(f"{value!r}, but MPS is not available here"), "'cpu' or a device this machine has")
        return dev
    if dev.type == "meta":
        raise fail(name, value, expected, "The meta device holds no data, so nothing can be computed on it.")
    raise fail(name, value, expected)


def tensor(
    name: str,
    value: Any,
    *,
    shape: Sequence[int | None | str] | None = None,
    ndim: int | None = None,
    floating: bool = False,
    integral: bool = False,
    finite: bool = False,
    convert: bool = False,
) -> Tensor:
    """``value`` as a ``torch.Tensor`` checked for rank (``ndim``), shape (``shape``: an int fixes a size,
    ``None`` or a name leaves it free), dtype kind (``floating`` / ``integral``; complex and bool are never
    accepted as either) and finiteness. ``convert`` accepts numpy arrays and nested lists."""
    import torch

    if not isinstance(value, torch.Tensor):
        if not convert or isinstance(value, (str, bytes, bool)) or value is None:
            raise fail(name, value, "a torch.Tensor", "Convert with torch.as_tensor(...).")
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise fail(name, value, "a tensor or array-like of numbers") from error
    dense(name, value)
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and value.ndim != ndim:
        if shape is not None:
            dims = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
            raise fail(name, value, f"a tensor of shape {dims}")
        raise fail(name, value, f"a tensor with {ndim} axes")
    if shape is not None:
        for axis, (size, want) in enumerate(zip(value.shape, shape, strict=True)):
            if isinstance(want, int) and not isinstance(want, bool) and size != want:
                expected = "[" + ", ".join(str(s) if s is not None else "?" for s in shape) + "]"
                raise fail(name, value, f"shape {expected} (axis {axis} of size {want})")
    if floating and not value.is_floating_point():
        raise fail(name, value, "a floating-point tensor (float16, bfloat16, float32, float64)", "Cast with .float().")
    if integral and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise fail(name, value, "an integer tensor (token ids)", "Cast with .long().")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise fail(name, value, "finite values", f"It holds {bad} NaN or infinite entries.")
    return value


def dense(name: str, value: Tensor) -> Tensor:
    """``value`` if it is a dense (strided) tensor that holds data: sparse layouts and the ``meta`` device (shapes
    only, e.g. a model moved with ``.to("meta")`` or weights offloaded without an offload folder) are refused."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise fail(name, value, "a torch.Tensor")
    if value.layout != torch.strided:
        raise fail(name, value, "a dense (strided) tensor", "Convert with .to_dense().")
    if value.is_meta:
        raise fail(name, value, "a tensor that holds data, not one on the meta device",
                   "The weights were never loaded (or were moved to 'meta'); load the model onto a real device.")
    return value


def all_finite(value: Tensor) -> bool:
    """Whether every entry of a floating ``value`` is finite, without an element-wise mask where it can: a NaN or
    inf entry makes the sum NaN or inf, so a finite sum (float32 or wider, read once) settles it; only a sum that
    overflowed is checked entry by entry. ``value`` must be a tensor (``CircuitkitError`` otherwise)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise fail("all_finite: value", value, "a torch.Tensor")
    if not (value.is_floating_point() or value.is_complex()):
        return True
    total = value.sum(dtype=torch.float32) if value.dtype in (torch.float16, torch.bfloat16) else value.sum()
    return bool(torch.isfinite(total).all()) or bool(torch.isfinite(value).all())


def finite_result(name: str, value: Tensor, *, why: str = "") -> Tensor:
    """Raise if a computed result holds NaN or inf (a result must never be silently non-finite)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise fail(name, value, "a torch.Tensor result")
    if value.is_floating_point() or value.is_complex():
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            reason = f" ({why})" if why else ""
            raise CircuitkitError(
                f"{name}: the result has {bad} NaN or infinite entries of {value.numel()}{reason}; expected finite "
                "values. Check the inputs for NaN/inf or values too large for their dtype."
            )
    return value


__all__ = [
    "MAX_SEED",
    "all_finite",
    "bounded_list",
    "boolean",
    "dense",
    "device",
    "fail",
    "finite_result",
    "given",
    "integer",
    "option",
    "positive_int",
    "real",
    "seed",
    "tensor",
]
