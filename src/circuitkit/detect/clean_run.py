"""One clean forward pass that serves every measurement needing one.

Why: head scores (patterns), the induction loss, the mean-ablation values (each head's mean ``z``) and the
residual streams that exact ablation resumes from all come from the same clean run over the same batch.
:func:`clean_run` does that pass once, with the callers' extra hooks attached (e.g. the pattern scorer), and
keeps only what was asked for: per-token losses ``[batch, pos - 1]``, per-layer mean ``z`` ``[head, d_head]``
and per-layer residual streams ``[batch, pos, d_model]`` (each on its layer's device: with a sharded model
nothing is moved across devices here).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit.detect.loss import token_losses
from circuitkit.detect.node_patching import unit_mean
from circuitkit.detect.reference import Keep, reference_pass
from circuitkit.detect.tokens import TokenBatch
from circuitkit.models.adapters import HOOKS, HookFn, ModelAdapter


@dataclass
class CleanRun:
    """What one clean pass kept (see the module docstring)."""

    batch: TokenBatch
    losses: Tensor  # [batch, pos - 1] on the CPU
    z_means: dict[int, Tensor] = field(default_factory=dict)  # layer -> [head, d_head]
    resid_pre: dict[int, Tensor] = field(default_factory=dict)  # layer -> [batch, pos, d_model]

    @property
    def repeated_loss(self) -> float:
        """Mean loss over the repeated copies (the quantity ablation and attribution move)."""
        return float(self.losses[:, self.batch.repeated_copies].mean())

    @property
    def repeated_per_sequence(self) -> Tensor:
        """``[batch]``: each sequence's mean loss over the repeated copies (their mean is :attr:`repeated_loss`)."""
        return self.losses[:, self.batch.repeated_copies].float().mean(dim=1)


def clean_run(
    adapter: ModelAdapter,
    batch: TokenBatch,
    *,
    z_means: bool = False,
    resid_layers: Collection[int] = (),
    extra_hooks: Sequence[tuple[str, HookFn]] = (),
) -> CleanRun:
    """Run ``batch`` once through the model, keeping the losses, (optionally) every layer's mean ``z`` and the
    residual streams entering ``resid_layers``."""
    keep = Keep(z_mean=range(adapter.spec.n_layers) if z_means else (), resid=sorted(set(resid_layers)))
    with torch.no_grad():
        # the residual streams are copied: exact ablation resumes from them after this pass's tensors are gone
        logits, kept = reference_pass(adapter, batch.tokens, keep, hooks=extra_hooks, clone=True)
        losses = token_losses(logits, batch.tokens).cpu()
    return CleanRun(batch=batch, losses=losses, z_means=kept.z_mean, resid_pre=kept.resid)


def z_leaf_hook(run: CleanRun, n_heads: int, values: dict[int, Tensor], leaves: dict[int, Tensor]) -> HookFn:
    """A ``hook_z`` hook for a pass that differentiates against each layer's ``z``: ``z`` ``[batch, pos, head,
    d_head]`` checked, kept detached in ``values[layer]`` with its mean in ``run.z_means``, and a zero tensor
    ``leaves[layer]`` added to it (the handle ``dL/dz`` is taken against; it changes no value)."""
    from circuitkit.errors import CircuitkitError

    def on_z(z: Tensor, hook: Any) -> Tensor:
        if z.ndim != 4 or z.shape[2] != n_heads:
            raise CircuitkitError(
                f"{hook.name} has shape {tuple(z.shape)}; expected [batch, pos, {n_heads}, d_head] "
                "to attribute heads."
            )
        layer = HOOKS.layer_of(hook.name)
        values[layer] = z.detach()
        run.z_means[layer] = unit_mean(values[layer])
        leaves[layer] = torch.zeros_like(z, requires_grad=True)
        return z + leaves[layer]

    return on_z


__all__ = ["CleanRun", "clean_run", "z_leaf_hook"]
