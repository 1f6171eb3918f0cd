"""Synthetic scans for the report tests: every field of :class:`circuitkit.scan_types.Scan` filled from seeded
random tensors, with a planted induction circuit, at any size (up to GPT-2-XL's 48 x 25 heads) and no model.

The planted circuit: previous-token heads ``(0, 1)`` (and ``(1, 3)`` when the model has them) attend to the
previous position; induction heads ``(L-1, 0)`` and ``(1, 2)`` (when ``L > 2``) attend to the token after the
previous occurrence; their K-composition is 0.9 (baseline 0.25), their ablation raises the loss by about 2 nats.
Scores are computed from the synthetic patterns (so table, heatmaps and patterns agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitkit import CompositionBaseline, top_edges
from circuitkit.circuits.evidence import EdgeEvidence
from circuitkit.circuits.faithfulness import Circuit, CurvePoint
from circuitkit.circuits.patching import PathPatching
from circuitkit.detect.loss import InductionLoss
from circuitkit.detect.registry import registered
from circuitkit.detect.scores import HeadScores
from circuitkit.edge_effect import EdgeEffect
from circuitkit.scan_types import Agreement, HeadEffects, ModelSummary, Scan, ScanSettings

EVIL_TOKEN = "</script><img src=x onerror=alert(1)>&amp;"
EVIL_NAME = "synthetic <model> & \"co\""
BASELINE = {"Q": 0.25, "K": 0.25, "V": 0.3}
BASELINE_STD = 0.02
PLANTED_COMPOSITION = 0.9
SIZES = {  # name -> (n_layers, n_heads, n_kv_heads, d_head)
    "2x4": (2, 4, None, 8),
    "12x12": (12, 12, None, 64),
    "30x9": (30, 9, 3, 64),  # grouped-query attention
    "48x25": (48, 25, None, 64),
}


@dataclass(frozen=True)
class FakeEvidence:
    """:class:`circuitkit.circuits.CircuitEvidence` without the full attribution and patching results it
    keeps (the report reads ``rows`` and ``to_json()`` only)."""

    rows: tuple[EdgeEvidence, ...]

    def to_json(self) -> dict:
        return {"metric": "loss", "corrupt": "resample", "rows": [r.to_json() for r in self.rows]}


def planted(n_layers: int, n_heads: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(previous-token heads, induction heads) planted in a model of this size."""
    previous = [(0, 1 % n_heads)]
    induction = [(n_layers - 1, 0)]
    if n_layers > 2 and n_heads > 3:
        previous.append((1, 3))
        induction.insert(0, (2, 2))
    return previous, induction


def synthetic_scan(
    n_layers: int = 2,
    n_heads: int = 4,
    *,
    n_kv_heads: int | None = None,
    d_head: int = 8,
    block_len: int = 6,
    n_repeats: int = 2,
    seed: int = 0,
    circuit: bool = True,
    ablate_top: int = 6,
    verified: bool = False,
) -> Scan:
    g = torch.Generator().manual_seed(seed)
    pos = 1 + n_repeats * block_len
    previous, induction = planted(n_layers, n_heads)

    # tokens: BOS + a block (with one hostile string) repeated
    block = [f"t{i}" for i in range(block_len - 1)] + [EVIL_TOKEN]
    tokens = ("<BOS>", *(block * n_repeats))
    ids = torch.tensor([0] + list(range(1, block_len + 1)) * n_repeats)

    # attention patterns [L, H, pos, pos]: peaky random, then the planted heads
    causal = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    logits = 3.0 * torch.randn(n_layers, n_heads, pos, pos, generator=g)
    patterns = logits.masked_fill(causal, float("-inf")).softmax(-1)
    q = torch.arange(pos)
    prev_target = torch.zeros(pos, pos)
    prev_target[q[1:], q[1:] - 1] = 1.0
    prev_target[0, 0] = 1.0
    ind_target = torch.zeros(pos, pos)
    has_target = torch.zeros(pos, dtype=torch.bool)
    for i in range(pos):
        earlier = [j for j in range(i) if ids[j] == ids[i]]
        if earlier and earlier[-1] + 1 < i:
            ind_target[i, earlier[-1] + 1] = 1.0
            has_target[i] = True
    ind_rows = ind_target.clone()
    ind_rows[~has_target, 0] = 1.0  # rows without a target attend to BOS
    for head in previous:
        patterns[head] = 0.9 * prev_target + 0.1 * patterns[head]
    for head in induction:
        patterns[head] = 0.9 * ind_rows + 0.1 * patterns[head]

    # pattern scores computed from the patterns (the formula of circuitkit.detect.registry)
    induction_score = (patterns * ind_target).sum((-1, -2)) / has_target.sum()
    previous_score = patterns.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
    values = {
        "induction": induction_score,
        "previous_token": previous_score,
        "duplicate_token": torch.rand(n_layers, n_heads, generator=g) * 0.3,
        "current_token": patterns.diagonal(dim1=-2, dim2=-1)[..., 1:].mean(-1),
        "first_token": patterns[..., 1:, 0].mean(-1),
        "copying": torch.rand(n_layers, n_heads, generator=g) * 2 - 1,
    }
    definitions = {}
    scores = {}
    for definition in registered():
        if definition.name not in values:
            continue
        neutral = definition.neutral if definition.kind == "weight" else 1.0 / (pos / 2)
        definitions[definition.name] = definition.with_neutral(neutral)
        scores[definition.name] = values[definition.name].float()
    head_scores = HeadScores(scores, definitions, tokens=ids[None], patterns=patterns, block_len=block_len,
                             n_repeats=n_repeats, bos=0)

    # loss, attribution, exact ablation of the top heads
    per_position = torch.cat([4.6 + 0.2 * torch.rand(block_len, generator=g),
                              0.4 + 0.2 * torch.rand(pos - 1 - block_len, generator=g)])
    loss = InductionLoss(per_position, float(per_position[:block_len].mean()),
                         float(per_position[block_len:].mean()))
    effect = 0.05 * torch.randn(n_layers, n_heads, generator=g)
    for head in induction:
        effect[head] = 2.0
    for head in previous:
        effect[head] = 1.2
    estimate = effect + 0.1 * torch.randn(n_layers, n_heads, generator=g)
    attribution = HeadEffects("attribution", "mean", 0.5, estimate)
    exact = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for (layer, head), _ in attribution.top(ablate_top, absolute=True):
        exact[layer, head] = True
    ablation = HeadEffects("ablation", "mean", 0.5, torch.where(exact, effect, torch.tensor(float("nan"))), exact)
    agreement = Agreement(int(exact.sum()), 0.93, ((n_layers - 1, 0), 2.0, float(estimate[n_layers - 1, 0])))

    # composition around the random baseline, the planted edges strong in K
    src = torch.arange(n_layers)[:, None, None, None]
    dst = torch.arange(n_layers)[None, None, :, None]
    composition, edges, baselines = {}, {}, {}
    for mode in "QKV":
        raw = BASELINE[mode] + BASELINE_STD * torch.randn(n_layers, n_heads, n_layers, n_heads, generator=g)
        if mode == "K":
            for a in previous:
                for b in induction:
                    if a[0] < b[0]:
                        raw[a[0], a[1], b[0], b[1]] = PLANTED_COMPOSITION
        composition[mode] = torch.where(src < dst, raw, torch.zeros(())).clamp(min=0)
        edges[mode] = top_edges(composition[mode], 5)
        baselines[mode] = CompositionBaseline(BASELINE[mode], BASELINE_STD, None, 32)
    spectra = {
        name: (torch.rand(n_layers, n_heads, d_head, generator=g) ** 3).sort(-1, descending=True).values * 4
        for name in ("QK", "OV")
    }
    evidence = None
    if circuit:
        rows = []
        for a in previous:
            for b in induction:
                if a[0] < b[0]:
                    rows.append(EdgeEvidence(a, b, "k", PLANTED_COMPOSITION, 0.8, 0.9))
        # strong in the weights, carries nothing; and the reverse
        rows.append(EdgeEvidence((0, 0), induction[-1], "q", 0.6, 0.01, 0.0, weight_only=True))
        rows.append(EdgeEvidence((0, n_heads - 1), induction[-1], "v", 0.25, 0.7, None, effect_only=True))
        evidence = FakeEvidence(tuple(rows))
    found = synthetic_circuit(previous, induction, n_layers * n_heads, evidence) if verified else None
    d_model = n_heads * d_head
    return Scan(
        model=ModelSummary(EVIL_NAME, n_layers, n_heads, d_model, d_head, d_vocab=50_257, n_ctx=1024,
                           n_kv_heads=n_kv_heads, attn_only=False, family="synthetic"),
        settings=ScanSettings(block_len=block_len, n_repeats=n_repeats, batch=4, seed=seed, bos=0, ablate="top",
                              ablate_top=ablate_top, ablation_method="mean", top_k=5, device="cpu",
                              edge_attribution_steps=2 if circuit else None),
        head_scores=head_scores,
        tokens=tokens,
        patterns=patterns,
        induction_loss=loss,
        attribution=attribution,
        ablation=ablation,
        agreement=agreement,
        composition=composition,
        baselines=baselines,
        edges=edges,
        spectra=spectra,
        circuit=evidence,
        induction_heads=tuple(induction),
        previous_token_heads=tuple(previous),
        verified=found,
    )


def synthetic_circuit(previous: list, induction: list, n_total: int, evidence: FakeEvidence | None) -> Circuit:
    """A verified circuit on the planted heads: faithfulness rising with n (0.92 at the planted size), the planted
    K-edges patched (0.9 nats)."""
    heads = tuple(previous + induction)
    n = len(heads)
    sizes = sorted({0, 1, 2, 4, 8, 16, 32, 64, 128, 256, n, n - 1} & set(range(n_total)) | {n_total})
    curve = tuple(CurvePoint(k, 1.0 if k == n_total else min(0.995, 0.92 * (k / n) ** 1.5) if k <= n
                             else 0.92 + 0.08 * (k - n) / (n_total - n), 4.0 - 3.5 * (k / n_total)) for k in sizes)
    patched = () if evidence is None else tuple(
        EdgeEffect.between_heads(r.src, r.dst, r.channel, clean=0.5, patched=0.5 + r.patched, effect=r.patched)
        for r in evidence.rows
        if r.patched is not None and r.src in heads and r.dst in heads)
    return Circuit(heads=heads, faithfulness=0.92, necessity=3.1, target=0.8, curve=curve, method="mean",
                   clean_loss=0.5, all_ablated_loss=4.0, circuit_loss=0.78, ranking=heads, passes=14,
                   edges=PathPatching(patched, "loss", "resample"),
                   roles={"induction": tuple(induction), "previous-token": tuple(previous)}, ranked_by="joint")


def sized_scan(size: str, *, block_len: int = 20, seed: int = 0, verified: bool = False) -> Scan:
    """A synthetic scan at one of :data:`SIZES` with the default block length (20, as the scan's)."""
    n_layers, n_heads, n_kv_heads, d_head = SIZES[size]
    return synthetic_scan(n_layers, n_heads, n_kv_heads=n_kv_heads, d_head=d_head, block_len=block_len, seed=seed,
                          ablate_top=8, verified=verified)
