"""A memory estimate before the first pass: refuse a scan that cannot fit, before any work, with what to lower.

Why: a ``--batch`` of ten million or a ``--block-len`` of thousands on a long-context model used to run for up to a
minute and then be killed by the kernel (nothing printed) or die in the allocator's traceback. The sizes of what a
scan holds at its peak follow from the model's shape and the token batch alone, so they can be checked first.

The estimate, in float32 bytes (4 per element; half-precision models are analysed in float32), with
``B`` sequences of ``S = n_repeats * block_len + 1`` tokens (BOS included), ``L`` layers, ``H`` heads:

- **activations**: the residual stream at every layer boundary, ``(L + 1) B S d_model``, and per layer what the
  backward pass keeps, about ``B S (6 d_model + 4 H d_head)`` (queries, keys, values, head outputs, the MLP);
- activations doubled for the gradients of the attribution pass;
- **attention patterns**: scores, pattern, the pattern kept for scoring, and their gradients, ``6 L H B S^2``;
- **logits**: ``3 B S d_vocab`` (logits, log-probabilities, their gradient) for one pass;
- **edge buffers** (with the circuit stage): every head's output on the clean and the corrupted run and their
  gradients, ``4 L H B S d_model``;
- **tokens**: ``2 B S`` int64 ids.

The estimate is that sum times :data:`MARGIN` (measured on the bundled model, the true peak was 0.9 to 1.1
times the sum). The
check compares it with the memory the device has free now (:func:`available_memory`: CUDA's ``mem_get_info``; on
the CPU, ``MemAvailable`` of ``/proc/meminfo`` and any cgroup limit) and raises one
:class:`~circuitkit.CircuitkitError` line naming the estimate, its largest parts, and ``--batch`` / ``--block-len``
values that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuitkit import validate
from circuitkit.device_memory import available_memory, size_text
from circuitkit.errors import CircuitkitError

FLOAT_BYTES = 4
"""Analysis runs in float32."""
TOKEN_BYTES = 8
"""Token ids are int64."""
MARGIN = 1.25
"""The sum of the parts times this is the estimate: measured on the bundled model (batch 256-1024, block 8-30),
the rise of the peak resident memory during a scan was 0.9 to 1.1 times the sum, varying from run to run."""
DEFAULT_BLOCK_LEN = 20
"""The scan's default block length (:data:`circuitkit.detect.tokens.DEFAULT_BLOCK_LEN`), capped to fit ``n_ctx``."""

__all__ = ["MemoryEstimate", "available_memory", "check_memory", "estimate_memory"]


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak of a scan, in bytes, by part (see the module docstring for the formulas)."""

    activations: int
    patterns: int
    logits: int
    edges: int
    tokens: int
    batch: int
    block_len: int
    seq_len: int

    @property
    def total(self) -> int:
        """The estimated peak: the sum of the parts times :data:`MARGIN`."""
        return int(MARGIN * (self.activations + self.patterns + self.logits + self.edges + self.tokens))

    def parts(self) -> str:
        named = {"activations": self.activations, "attention patterns": self.patterns, "logits": self.logits,
                 "edge buffers": self.edges, "tokens": self.tokens}
        ranked = sorted(((v, k) for k, v in named.items() if v), reverse=True)
        return ", ".join(f"{k} {_size(v)}" for v, k in ranked[:3])


_size = size_text


def _spec(model: Any, device: Any = None):
    from circuitkit.models.adapters import ModelAdapter, adapt

    adapter = model if isinstance(model, ModelAdapter) else adapt(model, device, place_model=False)
    return adapter.spec


def _block_len(spec: Any, block_len: int | None, n_repeats: int, bos: bool) -> int:
    if block_len is not None:
        return block_len
    if spec.n_ctx is None:
        return DEFAULT_BLOCK_LEN
    return max(2, min(DEFAULT_BLOCK_LEN, (spec.n_ctx - int(bos)) // n_repeats))


def estimate_memory(model: Any, batch: int, block_len: int | None = None, n_repeats: int = 2, *,
                    bos: bool = True, circuit: bool = True, device: Any = None) -> MemoryEstimate:
    """The estimated peak memory of a scan of ``model`` (a model or a ``ModelAdapter``) on ``batch`` sequences of
    ``n_repeats`` copies of a block of ``block_len`` tokens (the default block length when None), BOS first when
    ``bos``; edge buffers counted when ``circuit``. Python ints throughout: no overflow for any size."""
    batch = validate.positive_int("estimate_memory: batch", batch)
    if block_len is not None:
        block_len = validate.integer("estimate_memory: block_len", block_len, minimum=2)
    n_repeats = validate.integer("estimate_memory: n_repeats", n_repeats, minimum=2)
    bos = validate.boolean("estimate_memory: bos", bos)
    circuit = validate.boolean("estimate_memory: circuit", circuit)
    spec = _spec(model, device)
    block_len = _block_len(spec, block_len, n_repeats, bos)
    L, H, d_model, d_head, d_vocab = spec.n_layers, spec.n_heads, spec.d_model, spec.d_head, spec.d_vocab
    S = n_repeats * block_len + int(bos)
    B = batch
    per_layer = B * S * (6 * d_model + 4 * H * d_head)
    activations = 2 * FLOAT_BYTES * ((L + 1) * B * S * d_model + L * per_layer)
    patterns = FLOAT_BYTES * 6 * L * H * B * S * S
    logits = FLOAT_BYTES * 3 * B * S * d_vocab
    edges = FLOAT_BYTES * 4 * L * H * B * S * d_model if circuit and L > 1 else 0
    tokens = TOKEN_BYTES * 2 * B * S
    return MemoryEstimate(activations=activations, patterns=patterns, logits=logits, edges=edges, tokens=tokens,
                          batch=B, block_len=block_len, seq_len=S)


def check_memory(model: Any, batch: int, block_len: int | None = None, n_repeats: int = 2, *, bos: bool = True,
                 circuit: bool = True, device: Any = None, available: int | None = None,
                 where: str = "scan") -> MemoryEstimate:
    """Raise one :class:`CircuitkitError` line if the scan's estimated peak (:func:`estimate_memory`) exceeds the
    memory free on the model's device (``available`` bytes when given, else :func:`available_memory`); else return
    the estimate. The message gives the estimate, its largest parts, and a ``batch`` (and where that cannot help,
    a ``block_len``) that would fit."""
    estimate = estimate_memory(model, batch, block_len, n_repeats, bos=bos, circuit=circuit, device=device)
    spec = _spec(model, device)
    if available is None:
        available = available_memory(spec.device)
    else:
        available = validate.integer(f"{where}: available", available, minimum=0)
    if available is None or estimate.total <= available:
        return estimate
    per_sequence = max(1, estimate.total // estimate.batch)
    fitting = available // per_sequence
    if fitting >= 1:
        fix = f"Lower --batch (batch=) to {fitting} or less, or --block-len (block_len=)."
    else:
        fix = (f"Even one sequence of {estimate.seq_len} tokens needs {_size(per_sequence)}: lower --block-len "
               "(block_len=) and --batch (batch=1), or use a device with more memory.")
    raise CircuitkitError(
        f"{where}: given batch {estimate.batch} of {estimate.seq_len}-token sequences (block_len "
        f"{estimate.block_len}), which needs about {_size(estimate.total)} ({estimate.parts()}); expected at most "
        f"the {_size(available)} free on {spec.device}. {fix}"
    )
