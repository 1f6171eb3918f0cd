"""How many stacked copies of a batch one pass runs: the one rule every engine's batched passes use.

A pass that measures several variants of a batch (head sets ablated, edges patched, interpolation points) stacks
them as copies along the batch axis. Its largest tensor grows linearly with the copies: ``bytes_per_copy`` is that
tensor's size for one copy (the logits at the positions a metric reads, the patterns, or every sender's delta).
The copies of one pass are then the largest ``C >= 1`` with::

    C * bytes_per_copy   <= budget
    C * sequences        <= max_sequences     (where given: a bound on the sequences one pass holds)
    C                    <= max_copies        (where given)

Fewer copies a pass never change a result, only how many passes it takes: the total compute is the same.
"""

from __future__ import annotations

from circuitkit import validate


def copies_per_pass(bytes_per_copy: int, budget: int, *, sequences: int = 1, max_sequences: int | None = None,
                    max_copies: int | None = None) -> int:
    """The copies of one stacked pass (module docstring): at least 1, however large one copy is."""
    bytes_per_copy = validate.integer("copies_per_pass: bytes_per_copy", bytes_per_copy, minimum=0)
    budget = validate.integer("copies_per_pass: budget", budget, minimum=1)
    sequences = validate.integer("copies_per_pass: sequences", sequences, minimum=1)
    limits = [budget // max(1, bytes_per_copy)]
    if max_sequences is not None:
        limits.append(validate.integer("copies_per_pass: max_sequences", max_sequences, minimum=1) // sequences)
    if max_copies is not None:
        limits.append(validate.integer("copies_per_pass: max_copies", max_copies, minimum=1))
    return max(1, min(limits))


__all__ = ["copies_per_pass"]
