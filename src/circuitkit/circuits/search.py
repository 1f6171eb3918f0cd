"""Circuit searches beyond ranking: exact refinement of a ranked circuit, and learned node masks.

A ranked circuit is the smallest top-``n`` set of nodes by an attribution estimate. Ranking keeps members a search
would drop (a node the estimate overrates, or one another member backs up) and misses sets that only work
together (MIB, Mueller et al. 2025: mask optimisation does best at circuit localisation). Every search here has one
signature, registered by name in :data:`SEARCHES`::

    search(problem: SearchProblem, start: Sequence[int], target: float, **options) -> SearchResult

``problem`` holds the nodes (heads, and MLPs where they are nodes), an **exact** measure of any number of node sets
(``faithfulness(kept [sets, node] bool) -> [sets]``, many sets per stacked pass) and a **gated** run
(``gated(m [node] float) -> faithfulness``, differentiable in ``m``); ``start``: the ranked circuit (node indices).
Every figure a search returns is measured exactly; none is a relaxation's estimate.

``"ranked"``: ``start`` as it is (no pass).

``"refined"``: from ``start``, repeat (every set's faithfulness measured exactly, the candidates of a round in one
stacked call):

1. **drop**: measure every single drop ``C - {x}``. If some keep ``faithfulness >= target``, order them by the
   faithfulness they keep (least harm first) and measure the cumulative drops of the first ``2, 4, 8, ...`` of them
   (one more stacked call), then bisect between the largest of those reaching the target and the next; apply the
   largest cumulative drop found reaching the target (else the single least harmful drop).
2. **swap**, when no single drop reaches the target: with ``x, z`` among the ``swaps`` least harmful members and
   ``y`` among the ``swaps`` best non-members by ``problem.scores``, measure ``C - {x, z} + {y}`` (a swap of ``x``
   for ``y`` that allows the further drop of ``z``); apply the best reaching the target and go back to 1.

It stops when neither finds a set reaching the target; the result is then 1-minimal (no single member can go) and
never larger than ``start``. Cost per round: ``|C|`` sets, plus about ``log2 |C|`` cumulative ones, plus at most
``swaps^2 (swaps - 1) / 2`` swaps.

``"masks"`` (as edge pruning, Bhaskar et al. 2024, and MIB's mask-optimisation baselines, here over nodes): a mask
``m = sigmoid(theta)`` per node, the node's output ``z_m = v + m (z - v)`` (``v``: its patched value, ``z``: what it
computes in the gated run), and Adam on::

    loss(theta) = (1 - faithfulness(m))^2 + sparsity * mean(m)

for ``steps`` steps from ``theta = init`` plus a seeded perturbation of 0.01 (deterministic on CPU). The learned
``theta`` orders the nodes; the smallest top-``n`` of that order reaching the target is found exactly (geometric
sizes, then bisection), as the ranked search does with the attribution order. Cost: ``3 * steps`` passes (a
forward and a backward each), plus the exact sizes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate

SEARCH_NAMES = ("ranked", "refined", "masks")
DEFAULT_SWAPS = 4
"""Least harmful members and best non-members tried in the refined search's swaps (``4``: 24 sets a round)."""
DEFAULT_MASK_STEPS = 60
DEFAULT_MASK_LR = 0.1
DEFAULT_SPARSITY = 0.5
DEFAULT_MASK_INIT = 3.0
"""Initial mask logit: ``sigmoid(3) = 0.95``, every node nearly kept, so the optimisation starts near the clean run."""


@dataclass(frozen=True, eq=False)
class SearchProblem:
    """What a search needs of a model and its measure.

    ``nodes``: names of the ``N`` nodes (index = position); ``faithfulness(kept)``: ``kept`` ``[sets, N]`` bool
    (True: the node is in the circuit, clean; every other node patched) -> ``[sets]`` float, exact; ``gated(m)``:
    ``m`` ``[N]`` float in ``[0, 1]`` -> faithfulness as a 0-d tensor differentiable in ``m`` (one forward, one
    backward pass); ``passes()``: the passes spent so far on this problem's model; ``scores``: ``[N]``, the
    estimate that ranked the nodes (higher: more important), for the swap candidates."""

    nodes: tuple[str, ...]
    faithfulness: Callable[[Tensor], Tensor]
    gated: Callable[[Tensor], Tensor] | None
    passes: Callable[[], float]
    scores: Tensor

    @property
    def n(self) -> int:
        return len(self.nodes)

    def kept(self, sets: Sequence[Sequence[int]]) -> Tensor:
        """``[len(sets), N]`` bool masks of the node index sets."""
        out = torch.zeros(len(sets), self.n, dtype=torch.bool, device="cpu")
        for i, members in enumerate(sets):
            out[i, list(members)] = True
        return out

    def measure(self, sets: Sequence[Sequence[int]]) -> list[float]:
        """Each index set's exact faithfulness, all in one stacked call."""
        if not sets:
            return []
        values = self.faithfulness(self.kept(sets))
        return [float(v) for v in values]


@dataclass(frozen=True)
class SearchResult:
    """A search's circuit: ``kept`` node indices (sorted), their exact ``faithfulness``, ``passes`` spent (forward
    passes of the batch; stacked copies count one each, a backward two), ``start`` (the ranked circuit's size),
    ``trace`` (each accepted step: ``(kind, size, faithfulness)``), ``settings`` (the options that ran)."""

    search: str
    kept: tuple[int, ...]
    faithfulness: float
    passes: float
    start: int
    trace: tuple[tuple[str, int, float], ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.kept)

    def to_json(self, nodes: Sequence[str] | None = None) -> dict[str, Any]:
        return {"search": self.search, "size": self.size, "start_size": self.start,
                "faithfulness": self.faithfulness, "passes": self.passes,
                **({"nodes": [nodes[i] for i in self.kept]} if nodes is not None else {}),
                "trace": [{"step": k, "size": s, "faithfulness": f} for k, s, f in self.trace],
                "settings": dict(self.settings)}


def ranked(problem: SearchProblem, start: Sequence[int], target: float, *,
           start_faithfulness: float | None = None) -> SearchResult:
    """The ranked circuit as it is (measured only where ``start_faithfulness`` is not given)."""
    before = problem.passes()
    members = tuple(sorted(start))
    f = start_faithfulness if start_faithfulness is not None else problem.measure([members])[0]
    return SearchResult("ranked", members, float(f), problem.passes() - before, len(members))


def refined(problem: SearchProblem, start: Sequence[int], target: float, *, start_faithfulness: float | None = None,
            swaps: int = DEFAULT_SWAPS, max_rounds: int = 10_000, max_passes: float | None = None,
            progress: Any = None) -> SearchResult:
    """Drops and swaps from ``start`` while every accepted set reaches ``target`` (module docstring).
    ``max_rounds`` / ``max_passes``: stop before a round that would pass either (the circuit so far is returned,
    measured, and ``settings["stopped"]`` says why; it is then not known to be 1-minimal)."""
    swaps = validate.integer("refined search: swaps", swaps, minimum=0, maximum=64)
    max_rounds = validate.integer("refined search: max_rounds", max_rounds, minimum=1)
    if max_passes is not None:
        max_passes = validate.real("refined search: max_passes", max_passes, minimum=0.0)
    before = problem.passes()
    members = list(start)
    f = start_faithfulness if start_faithfulness is not None else problem.measure([members])[0]
    if f < target:
        given = validate.given(f"a set of {len(members)} nodes at faithfulness {f:.4g}")
        raise validate.fail("refined search: start", given, f"a circuit reaching the target {target}")
    trace: list[tuple[str, int, float]] = [("start", len(members), float(f))]
    rank_of = {node: i for i, node in enumerate(start)}  # ties: the later-ranked member goes first
    stopped = "max_rounds"
    for _ in range(max_rounds):
        if len(members) <= 1:
            stopped = "one node left"
            break
        if max_passes is not None and problem.passes() - before + len(members) > max_passes:
            stopped = "max_passes"
            break
        singles = problem.measure([[m for m in members if m != x] for x in members])
        harm = sorted(zip(singles, members, strict=True), key=lambda p: (-p[0], -rank_of.get(p[1], -1)))
        ok = [(v, x) for v, x in harm if v >= target]
        if progress is not None:
            progress(problem.passes() - before)
        if ok:
            sizes = [k for k in _powers(len(ok)) if k > 1]
            cumulative = problem.measure([[m for m in members if m not in {x for _, x in ok[:k]}] for k in sizes])
            reached = [(k, v) for k, v in zip(sizes, cumulative, strict=True) if v >= target]
            k, value = max(reached) if reached else (1, ok[0][0])
            high = min(2 * k, len(ok))  # the next size measured above k (below the target): bisect between
            while high - k > 1:
                mid = (k + high) // 2
                v = problem.measure([[m for m in members if m not in {x for _, x in ok[:mid]}]])[0]
                k, value, high = (mid, v, high) if v >= target else (k, value, mid)
            gone = {x for _, x in ok[:k]}
            members = [m for m in members if m not in gone]
            f = value
            trace.append(("drop", len(members), float(f)))
            continue
        stopped = "1-minimal, no swap reaches the target"
        if swaps == 0 or len(members) < 2:
            break
        least = [x for _, x in harm[:swaps]]
        outside = [i for i in torch.argsort(-problem.scores.float(), stable=True).tolist() if i not in set(members)]
        candidates = [(x, z, y) for x, z in itertools.combinations(least, 2) for y in outside[:swaps]]
        if not candidates:
            break
        sets = [[m for m in members if m not in (x, z)] + [y] for x, z, y in candidates]
        values = problem.measure(sets)
        best = max(range(len(sets)), key=lambda i: (values[i], -i))
        if values[best] < target:
            break
        members, f = sets[best], values[best]
        trace.append(("swap", len(members), float(f)))
    return SearchResult("refined", tuple(sorted(members)), float(f), problem.passes() - before, len(start),
                        tuple(trace), {"swaps": swaps, "max_passes": max_passes, "stopped": stopped})


def masks(problem: SearchProblem, start: Sequence[int], target: float, *, steps: int = DEFAULT_MASK_STEPS,
          lr: float = DEFAULT_MASK_LR, sparsity: float = DEFAULT_SPARSITY, seed: int = 0,
          init: float = DEFAULT_MASK_INIT, start_faithfulness: float | None = None, progress: Any = None,
          ) -> SearchResult:
    """Learned node masks, then the smallest top-``n`` of the learned order reaching ``target`` (module docstring).
    ``start`` is not used beyond its size (reported beside the result)."""
    steps = validate.integer("masks search: steps", steps, minimum=1, maximum=100_000)
    lr = validate.real("masks search: lr", lr, minimum=0.0, strict_minimum=True)
    sparsity = validate.real("masks search: sparsity", sparsity, minimum=0.0)
    seed = validate.seed("masks search: seed", seed)
    init = validate.real("masks search: init", init)
    if problem.gated is None:
        raise validate.fail("masks search: problem", validate.given("a problem without a gated run"),
                            "a problem that can run with continuous node masks")
    before = problem.passes()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    theta = (init + 0.01 * torch.randn(problem.n, generator=generator, device="cpu")).requires_grad_(True)
    optimiser = torch.optim.Adam([theta], lr=lr)
    losses: list[float] = []
    with torch.enable_grad():
        for _ in range(steps):
            m = torch.sigmoid(theta)
            loss = (1.0 - problem.gated(m)) ** 2 + sparsity * m.mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(problem.passes() - before)
    validate.finite_result("masks search: loss", torch.tensor(losses, device="cpu"),
                           why="the gated model's faithfulness overflowed; lower lr")
    order = torch.argsort(-theta.detach(), stable=True).tolist()
    n, f, measured = smallest_prefix(problem, order, target)
    kept = tuple(sorted(order[:n]))
    above_half = int((torch.sigmoid(theta.detach()) > 0.5).sum())
    trace = tuple(("size", k, v) for k, v in sorted(measured.items()))
    return SearchResult("masks", kept, f, problem.passes() - before, len(start), trace,
                        {"steps": steps, "lr": lr, "sparsity": sparsity, "seed": seed, "init": init,
                         "final_loss": losses[-1], "masks_above_half": above_half})


def smallest_prefix(problem: SearchProblem, order: Sequence[int], target: float) -> tuple[int, float, dict]:
    """The smallest ``n`` whose top-``n`` of ``order`` reaches ``target``: sizes ``1, 2, 4, ...`` until one
    reaches it, then bisection against the last below (each size one exact set). Returns ``(n, faithfulness,
    measured)``; ``n = N`` (every node) at faithfulness 1 where no smaller prefix reaches it."""
    N = len(order)
    measured: dict[int, float] = {}
    for n in _powers(N - 1):
        measured[n] = problem.measure([order[:n]])[0]
        if measured[n] >= target:
            break
    reached = [n for n in sorted(measured) if measured[n] >= target]
    if not reached:
        return N, 1.0, measured
    high = reached[0]
    low = max([n for n in measured if n < high], default=0)
    while high - low > 1:
        mid = (low + high) // 2
        measured[mid] = problem.measure([order[:mid]])[0]
        if measured[mid] >= target:
            high = mid
        else:
            low = mid
    return high, measured[high], measured


def _powers(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``, then ``n`` (empty for ``n < 1``)."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return [*out, n] if n >= 1 else []


SEARCHES: dict[str, Callable[..., SearchResult]] = {"ranked": ranked, "refined": refined, "masks": masks}
"""The registered searches by name, each ``(problem, start, target, **options) -> SearchResult``."""


def run_search(name: str, problem: SearchProblem, start: Sequence[int], target: float, **options: Any,
               ) -> SearchResult:
    """The search ``name`` (:data:`SEARCHES`) with its options; unknown names and options refused."""
    name = validate.option("search", name, tuple(SEARCHES))
    fn = SEARCHES[name]
    import inspect

    accepted = {p for p in inspect.signature(fn).parameters if p not in ("problem", "start", "target")}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise validate.fail(f"search {name!r}: options", validate.given(", ".join(unknown)),
                            f"options among {', '.join(sorted(accepted)) or '(none)'}")
    if not math.isfinite(target) or not 0 < target <= 1:
        raise validate.fail("search: target", target, "a faithfulness in (0, 1]")
    return fn(problem, start, target, **options)


# ------------------------------------------------------------------ the induction circuit as a search problem
def induction_problem(ablator: Any, clean_loss: float, all_ablated: float, scores: Tensor | None = None,
                      ) -> SearchProblem:
    """The heads of the induction circuit (:mod:`circuitkit.circuits.faithfulness`) as a :class:`SearchProblem`:
    nodes are every head ``(layer, head)`` (index ``layer * H + head``), a head outside a set ablated to the
    ablator's values; faithfulness ``(L_all - L_C) / (L_all - L_clean)``; ``scores`` ``[L, H]`` (the ranking's
    estimate, higher first) for the swaps (default: zeros)."""
    from circuitkit.detect.attribution import frozen_parameters
    from circuitkit.detect.loss import token_losses
    from circuitkit.models.adapters import HOOKS
    from circuitkit.ranking import head_name

    spec = ablator.adapter.spec
    L, H = spec.n_layers, spec.n_heads
    gap = all_ablated - clean_loss

    def faithfulness(kept: Tensor) -> Tensor:
        ablated = ~kept.view(-1, L, H)
        losses = torch.tensor(ablator.losses(ablated), dtype=torch.float64, device="cpu")
        return (all_ablated - losses) / gap

    def gated(m: Tensor) -> Tensor:
        tokens = ablator.batch.tokens
        gates = m.view(L, H)

        def hook(z: Tensor, hook: Any) -> Tensor:
            layer = HOOKS.layer_of(hook.name)
            value = ablator.values[layer].to(device=z.device, dtype=z.dtype)
            value = value[None, None] if value.ndim == 2 else value
            g = gates[layer].to(device=z.device, dtype=z.dtype)
            return value + g[None, None, :, None] * (z - value)

        with frozen_parameters(ablator.adapter.model):
            logits = ablator.adapter.run(tokens, [(HOOKS.z(layer), hook) for layer in range(L)],
                                         positions=ablator.positions)
            loss = token_losses(logits, tokens, ablator.batch.repeated_copies).float().mean()
        ablator.passes += 3
        return (all_ablated - loss) / gap

    names = tuple(head_name((layer, h)) for layer in range(L) for h in range(H))
    values = torch.zeros(L * H, device="cpu") if scores is None else scores.detach().float().cpu().reshape(-1)
    return SearchProblem(names, faithfulness, gated, lambda: float(ablator.passes), values)


def search_found(ablator: Any, circuit: Any, name: str, options: dict[str, Any] | None = None, *,
                 necessity: bool = True, intervals: tuple[int, float, int] | None = None, extra_passes: int = 0,
                 ) -> Any:
    """The induction circuit ``circuit`` (a :class:`~circuitkit.circuits.faithfulness.Circuit` found by ranking)
    searched further by ``name`` on ``ablator`` (an ``Ablator`` of the same batch and ablation): the same record with
    the searched ``heads`` (in ranking order), their ``faithfulness``, ``circuit_loss``, ``necessity`` and
    intervals (from the per-sequence losses of one more stacked call: nothing, everything, every head outside the
    circuit and, with ``necessity``, only the circuit ablated), ``passes`` grown by the search's and
    ``extra_passes``, and ``search`` (the :class:`SearchResult`). The curve stays the ranking's."""
    from dataclasses import replace

    from circuitkit.circuits.intervals import circuit_intervals, head_mask

    spec = ablator.adapter.spec
    L, H = spec.n_layers, spec.n_heads
    ranking = list(circuit.ranking)
    position = {head: i for i, head in enumerate(ranking)}
    scores = torch.zeros(L, H, device="cpu")
    for i, (layer, h) in enumerate(ranking):
        scores[layer, h] = float(len(ranking) - i)  # the ranking as a score: first is highest
    before = ablator.passes
    problem = induction_problem(ablator, circuit.clean_loss, circuit.all_ablated_loss, scores)
    start = [layer * H + h for layer, h in circuit.heads]
    result = run_search(name, problem, start, circuit.target, start_faithfulness=circuit.faithfulness,
                        **(options or {}))
    heads = tuple(sorted((divmod(i, H) for i in result.kept), key=lambda head: position.get(head, len(ranking))))
    sets = [torch.zeros(L, H, dtype=torch.bool, device="cpu"), torch.ones(L, H, dtype=torch.bool, device="cpu"),
            head_mask(heads, L, H, keep=True)] + ([head_mask(heads, L, H, keep=False)] if necessity else [])
    losses = ablator.losses(torch.stack(sets))
    rise = losses[3] - circuit.clean_loss if necessity else None
    bounds: dict[str, Any] = {}
    if intervals is not None:
        clean_each = ablator.sequence_losses(sets[0])
        bounds = circuit_intervals(ablator, ranking, [], heads, clean_each, necessity, *intervals)
        if bounds:
            bounds["curve"] = dict(circuit.intervals.get("curve", {}))
    return replace(circuit, heads=heads, faithfulness=result.faithfulness, circuit_loss=losses[2], necessity=rise,
                   passes=circuit.passes + int(round(ablator.passes - before)) + extra_passes, intervals=bounds,
                   search=result)


__all__ = ["SEARCHES", "SEARCH_NAMES", "SearchProblem", "SearchResult", "induction_problem", "masks", "ranked",
           "refined", "run_search", "search_found", "smallest_prefix"]
