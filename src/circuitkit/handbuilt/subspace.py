"""Named subspaces of the residual stream: the vocabulary hand-built circuits are written in.

Why: a hand-built circuit is a plan for who reads and writes which residual dimensions ("tokens live in
dims 0-9, the previous token's copy in 10-19"). Writing that plan down as named, checked subspaces keeps
overlaps and off-by-one slices out of the weight matrices.

A :class:`Subspace` is a set of standard-basis dimensions of a ``d_model``-dimensional residual stream.
Its :attr:`~Subspace.basis` is ``[k, d_model]`` with one unit row per dimension, so in the row convention
``coords @ basis`` writes ``k`` coordinates into the stream and ``resid @ basis.T`` reads them back.
A :class:`ResidualLayout` is a set of disjoint named subspaces of one stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.handbuilt import limits


@dataclass(frozen=True)
class Subspace:
    """Dimensions ``dims`` (distinct, in ``[0, d_model)``, in the given order) of a ``d_model`` stream."""

    name: str
    dims: tuple[int, ...]
    d_model: int

    def __post_init__(self) -> None:
        if not limits.text("Subspace: name", self.name).strip():
            raise validate.fail("Subspace: name", self.name, "a non-blank name (a layout is read by its names)")
        d_model = limits.width(f"Subspace {self.name!r}: d_model", self.d_model)
        dims = tuple(validate.bounded_list(f"Subspace {self.name!r}: dims", self.dims, d_model,
                                           "an iterable of distinct ints (e.g. range(0, 4))",
                                           why=f"d_model = {d_model} dimensions"))
        if not dims:
            raise CircuitkitError(f"Subspace {self.name!r}: given no dimensions; expected at least one.")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise CircuitkitError(f"Subspace {self.name!r}: given dims {describe(dims)}; expected ints.")
        bad = [d for d in dims if not 0 <= d < self.d_model]
        if bad:
            raise CircuitkitError(
                f"Subspace {self.name!r}: given dims {describe(bad)} out of range; expected dims in "
                f"[0, {self.d_model}) "
                f"for a residual stream of width {self.d_model}."
            )
        if len(set(dims)) != len(dims):
            raise CircuitkitError(f"Subspace {self.name!r}: given repeated dims in {dims}; expected distinct dims.")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "d_model", d_model)

    @classmethod
    def span(cls, name: str, start: int, stop: int, d_model: int) -> Subspace:
        """The contiguous dims ``start .. stop-1`` (``0 <= start < stop <= MAX_WIDTH``)."""
        limits.text("Subspace.span: name", name)
        start = validate.integer(f"Subspace.span {name!r}: start", start, minimum=0, maximum=limits.MAX_WIDTH - 1)
        stop = validate.integer(f"Subspace.span {name!r}: stop", stop, minimum=1, maximum=limits.MAX_WIDTH)
        if stop <= start:
            raise CircuitkitError(
                f"Subspace.span {name!r}: given start={start!r}, stop={stop!r}; expected ints with start < stop."
            )
        return cls(name, tuple(range(start, stop)), d_model)

    @property
    def size(self) -> int:
        return len(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    def __getitem__(self, index: int | slice) -> Subspace:
        """A sub-subspace: ``tokens[0:4]`` is the first four dims of ``tokens`` (named ``tokens[0:4]``)."""
        expected = f"an int in [-{self.size}, {self.size}) or a slice with a non-zero int step"
        if isinstance(index, Integral) and not isinstance(index, bool):
            index = int(index)
            if not -self.size <= index < self.size:
                raise validate.fail(f"Subspace {self.name!r}[...]", validate.given(f"index {index}"), expected)
            return Subspace(f"{self.name}[{index}]", (self.dims[index],), self.d_model)
        if not isinstance(index, slice) or any(
            part is not None and (isinstance(part, bool) or not isinstance(part, Integral))
            for part in (index.start, index.stop, index.step)
        ) or index.step == 0:
            raise validate.fail(f"Subspace {self.name!r}[...]", index, expected)
        picked = self.dims[index]
        if not picked:
            raise validate.fail(f"Subspace {self.name!r}[...]", index, f"a slice that keeps at least one of the "
                                f"{self.size} dims")
        label = f"{index.start or 0}:{index.stop if index.stop is not None else self.size}"
        return Subspace(f"{self.name}[{label}]", picked, self.d_model)

    def __add__(self, other: Subspace) -> Subspace:
        """The union, in order (``a + b`` reads ``a``'s dims then ``b``'s); they must not overlap."""
        if not isinstance(other, Subspace):
            raise validate.fail(f"Subspace {self.name!r} + other", other, "a Subspace")
        check_disjoint([self, other])
        return Subspace(f"{self.name}+{other.name}", self.dims + other.dims, self.d_model)

    def basis(self, dtype: torch.dtype = torch.float32) -> Float[Tensor, "k d_model"]:
        """``[k, d_model]`` unit rows: ``coords @ basis`` writes, ``resid @ basis.T`` reads (row convention)."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise validate.fail(f"Subspace {self.name!r}.basis: dtype", dtype, "a floating torch.dtype (e.g. "
                                "torch.float32)")
        out = torch.zeros(self.size, self.d_model, dtype=dtype)
        out[torch.arange(self.size), torch.tensor(self.dims)] = 1
        return out

    def read(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... k"]:
        """The coordinates of ``resid`` in this subspace."""
        resid = validate.tensor(f"Subspace {self.name!r}.read: resid", resid, floating=True, finite=True)
        if resid.ndim == 0 or resid.shape[-1] != self.d_model:
            raise CircuitkitError(
                f"Subspace {self.name!r}.read: given {describe(resid)}; expected a last axis of d_model="
                f"{self.d_model}."
            )
        return resid[..., list(self.dims)]

    def __repr__(self) -> str:
        dims = self.dims
        contiguous = dims == tuple(range(dims[0], dims[0] + len(dims)))
        shown = f"{dims[0]}-{dims[-1]}" if contiguous and len(dims) > 1 else ",".join(map(str, dims))
        return f"Subspace({self.name!r}, dims {shown} of {self.d_model})"


def check_disjoint(subspaces: Iterable[Subspace]) -> None:
    """Raise :class:`CircuitkitError` unless the subspaces share one ``d_model`` and no dimension."""
    if isinstance(subspaces, (str, bytes, Subspace)) or not isinstance(subspaces, Iterable):
        raise validate.fail("check_disjoint: subspaces", subspaces, "an iterable of Subspace")
    owner: dict[int, str] = {}
    widths = set()
    for sub in subspaces:
        if not isinstance(sub, Subspace):
            raise validate.fail("check_disjoint: subspaces", sub, "an iterable of Subspace (this item is not one)")
        widths.add(sub.d_model)
        for d in sub.dims:
            if d in owner:
                raise CircuitkitError(
                    f"subspaces {owner[d]!r} and {sub.name!r} overlap at dim {d}; expected disjoint subspaces. "
                    "Give each its own dimensions."
                )
            owner[d] = sub.name
    if len(widths) > 1:
        raise CircuitkitError(f"subspaces of different residual widths {sorted(widths)}; expected one d_model.")


class ResidualLayout(Mapping[str, Subspace]):
    """Disjoint named subspaces of one residual stream of width ``d_model``.

    ``ResidualLayout(16, {"input": range(0, 8), "head1": range(8, 12)})`` or, packing contiguous blocks in
    order, ``ResidualLayout.stack(tokens=10, prev=10, pos=9)`` (``d_model`` = the sum unless given larger).
    """

    def __init__(self, d_model: int, spaces: Mapping[str, Iterable[int]]) -> None:
        d_model = limits.width("ResidualLayout: d_model", d_model)
        if not isinstance(spaces, Mapping):
            raise validate.fail("ResidualLayout: spaces", spaces, "a mapping name -> dims, e.g. {'tok': range(0, 8)}")
        subs = [Subspace(name, dims, d_model) for name, dims in spaces.items()]
        check_disjoint(subs)
        self.d_model = d_model
        self._spaces = {sub.name: sub for sub in subs}

    @classmethod
    def stack(cls, d_model: int | None = None, **sizes: int) -> ResidualLayout:
        """Contiguous blocks of the given sizes, in keyword order, from dim 0."""
        sizes = {name: limits.width(f"ResidualLayout.stack: {name}", size) for name, size in sizes.items()}
        if d_model is not None:
            d_model = limits.width("ResidualLayout.stack: d_model", d_model)
        total = sum(sizes.values())
        if d_model is None:
            d_model = total
        if total > d_model:
            raise CircuitkitError(
                f"ResidualLayout.stack: given blocks of total size {total} ({sizes}); expected at most "
                f"d_model={d_model}. Enlarge d_model or shrink the blocks."
            )
        spaces, start = {}, 0
        for name, size in sizes.items():
            spaces[name] = range(start, start + size)
            start += size
        return cls(d_model, spaces)

    def __getitem__(self, name: str) -> Subspace:
        if name not in self:  # never raises, for an unhashable name too
            raise CircuitkitError(f"ResidualLayout: given {name!r}; expected one of {sorted(self._spaces)}.")
        return self._spaces[name]

    def __contains__(self, name: object) -> bool:
        """``name in layout``: True for a named subspace, False for anything else (never raises)."""
        try:
            return name in self._spaces
        except TypeError:  # unhashable
            return False

    def get(self, name: str, default: Any = None) -> Any:
        """The subspace called ``name``, or ``default`` (``Mapping.get`` would let the error escape)."""
        return self._spaces.get(name, default) if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._spaces)

    def __len__(self) -> int:
        return len(self._spaces)

    def free_dims(self) -> tuple[int, ...]:
        """Dimensions no named subspace uses."""
        used = {d for sub in self._spaces.values() for d in sub.dims}
        return tuple(d for d in range(self.d_model) if d not in used)

    def __repr__(self) -> str:
        inner = ", ".join(repr(sub) for sub in self._spaces.values())
        return f"ResidualLayout(d_model={self.d_model}: {inner})"
