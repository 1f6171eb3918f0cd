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
   ``y`` among the ``swaps`` best non-members, measure ``C - {x, z} + {y}`` (a swap of ``x`` for ``y`` that allows
   the further drop of ``z``); apply the best reaching the target and go back to 1. The best non-members are those
   with the largest first-order gain at ``C`` itself: the gradient of the gated run's faithfulness at ``C``'s 0/1
   mask (one forward and one backward pass), where the problem has a gated run; else ``problem.scores``. (The
   ranking's scores are taken at the clean run, far from a small circuit: on Qwen2.5-Coder's induction circuit its
   best non-members were not those whose addition helps the circuit most.)

Past ``singles`` members (an edge circuit of thousands of edges) a round of single drops costs too much; a
**block** round replaces step 1: the members, least important first by ``problem.scores``, cut into ``b`` blocks
(``b = 8`` at first), each block's drop measured (``b`` sets); those reaching the target are dropped together where
the first ``2, 4, ...`` of them (most faithful first) still reach it, else the best alone; where no block can go
``b`` doubles (the delta-debugging schedule), until blocks of one member cannot go or the circuit is down to
``singles`` members and single drops take over.

It stops when neither finds a set reaching the target; the result is then 1-minimal (no single member can go) and
never larger than ``start``. Cost per round: ``|C|`` sets, plus about ``log2 |C|`` cumulative ones, plus at most
``swaps^2 (swaps - 1) / 2`` swaps (and 3 passes for their candidates).

``"masks"`` (as edge pruning, Bhaskar et al. 2024, and MIB's mask-optimisation baselines, here over nodes): a logit
``theta`` per node, ``s = sigmoid(theta)``, the node kept where ``theta > 0``. Each step runs the gated model
(each node's output ``v + m (z - v)``; ``v``: its patched value, ``z``: what it computes in the gated run) with the
**straight-through** mask ``m = 1[theta > 0] + s - stop_gradient(s)``: the forward is the exact run of the set
``{theta > 0}`` (so every step measures a discrete set, by the same measure as the search's target), the backward
that of ``s``. The loss is a Lagrangian of the size under the faithfulness constraint::

    loss = lambda sum(s) - faithfulness(m)        theta <- theta - lr grad / max|grad|
    lambda <- lambda exp(rate (faithfulness - target))

The step is the gradient scaled so that the largest logit moves by ``lr``: the nodes keep their relative rates
(Adam's per-node normalisation moves every node at the same rate, so that the whole circuit crosses zero on one
step: measured on Qwen2.5-Coder, the set fell from 11 nodes to none). ``lambda`` (from ``sparsity``) rises while
the set is above the target and falls below it, so the trajectory follows the boundary of the constraint, adding
the nodes the gradient says help and removing those it says do not. ``theta`` starts at ``+init`` on ``start``
and ``-init`` elsewhere (``begin="start"``: the ranked circuit is the first set measured) or ``+init`` everywhere
(``begin="all"``), plus a seeded perturbation of ``0.01 init``. The answer is the smallest set the steps ran that
reached the target (most faithful first among equal sizes), confirmed by one exact stacked call over the best few;
the start where no smaller one was seen. ``refine``: the refined search from there. Cost: ``3 * steps`` passes (a
forward and a backward each), plus the confirmation (and the refinement).
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
from circuitkit.circuits.curve import faithfulness_of

SEARCH_NAMES = ("ranked", "refined", "masks")
REFINED_ESTIMATE = 15.0
"""The refined search's passes before it runs, roughly (IOI on a 0.5B model: 13): they depend on the circuit the
ranked search finds, so the bar revises the plan as it goes."""
DEFAULT_SWAPS = 4
"""Least harmful members and best non-members tried in the refined search's swaps (``4``: 24 sets a round)."""
DEFAULT_SINGLES = 256
"""Largest circuit whose refinement measures every single drop; above it, blocks of members (an edge circuit)."""
BLOCKS = 8
"""Blocks of a block round at first (doubled where none can go)."""
DEFAULT_MASK_STEPS = 60
DEFAULT_MASK_LR = 0.3
"""Largest change of a mask logit in one step."""
DEFAULT_SPARSITY = 0.003
"""The Lagrange multiplier ``lambda`` at the first step (per node kept, in units of faithfulness)."""
DEFAULT_MASK_RATE = 3.0
"""``lambda``'s multiplicative rate: ``exp(3 x 0.1)``, 1.35 a step, where faithfulness is 0.1 off the target."""
DEFAULT_MASK_INIT = 1.0
"""Initial mask logit magnitude (``sigmoid(1) = 0.73``)."""
CONFIRMED_SETS = 4
"""Smallest sets of the masks' trajectory confirmed by one exact stacked call."""


OPTION_CHECKS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "refined": {
        "swaps": lambda v: validate.integer("refined search: swaps", v, minimum=0, maximum=64),
        "singles": lambda v: validate.integer("refined search: singles", v, minimum=0),
        "max_rounds": lambda v: validate.integer("refined search: max_rounds", v, minimum=1),
        "max_passes": lambda v: None if v is None else validate.real("refined search: max_passes", v, minimum=0.0),
    },
    "masks": {
        "steps": lambda v: validate.integer("masks search: steps", v, minimum=1, maximum=100_000),
        "lr": lambda v: validate.real("masks search: lr", v, minimum=0.0, strict_minimum=True),
        "sparsity": lambda v: validate.real("masks search: sparsity", v, minimum=0.0, strict_minimum=True),
        "rate": lambda v: validate.real("masks search: rate", v, minimum=0.0),
        "init": lambda v: validate.real("masks search: init", v, minimum=0.0, strict_minimum=True),
        "begin": lambda v: validate.option("masks search: begin", v, ("start", "all")),
        "seed": lambda v: validate.seed("masks search: seed", v),
        "refine": lambda v: validate.boolean("masks search: refine", v),
    },
}
"""Each search's options and the check of each value: the one place they are checked, by the search as it starts
and, before any pass, by :func:`check_search_options`."""


def search_estimate(name: str, options: dict[str, Any] | None = None) -> float:
    """Planned passes of search ``name`` with ``options`` (checked), for a progress plan: none for ``"ranked"``;
    ``"refined"``: :data:`REFINED_ESTIMATE`, or its ``max_passes`` where that is lower; ``"masks"``: each step's
    gated forward + backward (3 passes) and the stacked call confirming :data:`CONFIRMED_SETS` sets (and the refined
    estimate with ``refine``): known before it runs."""
    options = options or {}
    checks = OPTION_CHECKS.get(name, {})
    if name == "refined":
        budget = checks["max_passes"](options.get("max_passes"))
        return REFINED_ESTIMATE if budget is None else min(REFINED_ESTIMATE, budget)
    if name == "masks":
        steps = checks["steps"](options.get("steps", DEFAULT_MASK_STEPS))
        refine = checks["refine"](options.get("refine", False))
        return 3.0 * steps + CONFIRMED_SETS + (REFINED_ESTIMATE if refine else 0.0)
    return 0.0


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
            swaps: int = DEFAULT_SWAPS, singles: int = DEFAULT_SINGLES, max_rounds: int = 10_000,
            max_passes: float | None = None, progress: Any = None) -> SearchResult:
    """Drops (single or in blocks) and swaps from ``start`` while every accepted set reaches ``target`` (module
    docstring). ``max_rounds`` / ``max_passes``: stop before a round that would pass either (the circuit so far is
    returned, measured, and ``settings["stopped"]`` says why; it is then not known to be 1-minimal); where the
    passes left do not afford a round of single drops, the round tries the least important members it affords
    (one pass each, leaving ``2 log2`` of the passes for measuring the drops together), and the search stops once
    such a round drops none or too few passes are left."""
    check = OPTION_CHECKS["refined"]
    swaps, singles = check["swaps"](swaps), check["singles"](singles)
    max_rounds, max_passes = check["max_rounds"](max_rounds), check["max_passes"](max_passes)
    before = problem.passes()
    members = list(start)
    f = start_faithfulness if start_faithfulness is not None else problem.measure([members])[0]
    if f < target:
        given = validate.given(f"a set of {len(members)} nodes at faithfulness {f:.4g}")
        raise validate.fail("refined search: start", given, f"a circuit reaching the target {target}")
    trace: list[tuple[str, int, float]] = [("start", len(members), float(f))]
    rank_of = {node: i for i, node in enumerate(start)}  # ties: the later-ranked member goes first
    importance = problem.scores.float()
    blocks = BLOCKS  # the block phase's number of blocks (doubles when no block can go)
    stopped = "max_rounds"
    for _ in range(max_rounds):
        if len(members) <= 1:
            stopped = "one node left"
            break
        if len(members) > singles:  # too many members for every single drop: blocks of the least important
            b = min(blocks, len(members))
            if max_passes is not None and problem.passes() - before + b > max_passes:
                stopped = "max_passes"
                break
            order = sorted(members, key=lambda m: (float(importance[m]), -rank_of.get(m, -1)))
            cut = [order[len(order) * i // b : len(order) * (i + 1) // b] for i in range(b)]  # none empty
            values = problem.measure([[m for m in members if m not in set(block)] for block in cut])
            ok = sorted(((v, i) for i, v in enumerate(values) if v >= target), key=lambda p: (-p[0], p[1]))
            if progress is not None:
                progress(problem.passes() - before)
            if not ok:
                if b == len(members):
                    stopped = "no block of one member can go"
                    break
                blocks = 2 * b
                continue
            ordered = [set(cut[i]) for _, i in ok]
            sizes = [k for k in _powers(len(ordered)) if k > 1]  # several blocks at once: they may go together
            together = problem.measure([[m for m in members if not any(m in b for b in ordered[:k])]
                                        for k in sizes])
            reached = [(k, v) for k, v in zip(sizes, together, strict=True) if v >= target]
            k, f = max(reached) if reached else (1, ok[0][0])
            gone = set().union(*ordered[:k])
            members = [m for m in members if m not in gone]
            trace.append(("block", len(members), float(f)))
            continue
        tried = members  # a round of single drops: every member, or as many of the least important as the budget
        left = None if max_passes is None else int(max_passes - (problem.passes() - before))  # affords
        if left is not None and left < len(members):
            # the drops together after it: sizes, bisection (a block phase may have spent past the budget already)
            affordable = left - 2 * math.ceil(math.log2(max(left, 0) + 1))
            if affordable < 1:
                stopped = "max_passes"
                break
            tried = sorted(members, key=lambda m: (float(importance[m]), -rank_of.get(m, -1)))[:affordable]
        singles_f = problem.measure([[m for m in members if m != x] for x in tried])
        harm = sorted(zip(singles_f, tried, strict=True), key=lambda p: (-p[0], -rank_of.get(p[1], -1)))
        ok_single = [(v, x) for v, x in harm if v >= target]
        if progress is not None:
            progress(problem.passes() - before)
        if len(tried) < len(members) and not ok_single:  # a partial round found none: untried members remain
            stopped = "max_passes"
            break
        if ok_single:
            sizes = [k for k in _powers(len(ok_single)) if k > 1]
            cumulative = problem.measure([[m for m in members if m not in {x for _, x in ok_single[:k]}]
                                          for k in sizes])
            reached = [(k, v) for k, v in zip(sizes, cumulative, strict=True) if v >= target]
            k, value = max(reached) if reached else (1, ok_single[0][0])
            high = min(2 * k, len(ok_single))  # the next size measured above k (below the target): bisect between
            while high - k > 1:
                mid = (k + high) // 2
                v = problem.measure([[m for m in members if m not in {x for _, x in ok_single[:mid]}]])[0]
                k, value, high = (mid, v, high) if v >= target else (k, value, mid)
            gone = {x for _, x in ok_single[:k]}
            members = [m for m in members if m not in gone]
            f = value
            trace.append(("drop", len(members), float(f)))
            continue
        stopped = "1-minimal, no swap reaches the target"
        if swaps == 0 or len(members) < 2:
            break
        least = [x for _, x in harm[:swaps]]
        outside = [i for i in _gains(problem, members) if i not in set(members)]
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
                        tuple(trace), {"swaps": swaps, "singles": singles, "max_passes": max_passes,
                                       "stopped": stopped, "swap_candidates": "gradient" if problem.gated is not None
                                       else "scores"})


def _gains(problem: SearchProblem, members: Sequence[int]) -> list[int]:
    """Every node, best swap candidate first: by the gradient of the gated run's faithfulness at the circuit's own
    0/1 mask (the first-order gain of adding a node to it: one forward and one backward pass) where the problem has a
    gated run, else by ``problem.scores``."""
    if problem.gated is None:
        return torch.argsort(-problem.scores.float(), stable=True).tolist()
    m = torch.zeros(problem.n, dtype=torch.float32, device="cpu")
    m[list(members)] = 1.0
    m.requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(problem.gated(m), m)
    return torch.argsort(-grad.detach(), stable=True).tolist()


def masks(problem: SearchProblem, start: Sequence[int], target: float, *, steps: int = DEFAULT_MASK_STEPS,
          lr: float = DEFAULT_MASK_LR, sparsity: float = DEFAULT_SPARSITY, rate: float = DEFAULT_MASK_RATE,
          init: float = DEFAULT_MASK_INIT, begin: str = "start", seed: int = 0, refine: bool = False,
          start_faithfulness: float | None = None, progress: Any = None) -> SearchResult:
    """Learned node masks (module docstring): the smallest set the optimisation's exact forward passes saw reach
    ``target``, confirmed by one exact set (then refined further where ``refine``)."""
    check = OPTION_CHECKS["masks"]
    steps, lr, sparsity, rate = check["steps"](steps), check["lr"](lr), check["sparsity"](sparsity), check["rate"](rate)
    init, begin, seed, refine = check["init"](init), check["begin"](begin), check["seed"](seed), check["refine"](refine)
    if problem.gated is None:
        raise validate.fail("masks search: problem", validate.given("a problem without a gated run"),
                            "a problem that can run with continuous node masks")
    before = problem.passes()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    theta = torch.full((problem.n,), -init if begin == "start" else init, dtype=torch.float32, device="cpu")
    if begin == "start":
        theta[list(start)] = init
    theta += 0.01 * init * torch.randn(problem.n, generator=generator, device="cpu")  # breaks ties, seeded
    lam = sparsity
    seen: dict[tuple[int, ...], float] = {}  # every set the steps ran exactly -> its faithfulness
    for _ in range(steps):
        theta.requires_grad_(True)
        with torch.enable_grad():
            soft = torch.sigmoid(theta)
            hard = (theta > 0).to(soft.dtype)
            f = problem.gated(hard + soft - soft.detach())  # the forward runs the set {theta > 0} exactly
            (grad,) = torch.autograd.grad(lam * soft.sum() - f, theta)
        value = float(f.detach())
        if not math.isfinite(value):
            raise validate.fail("masks search: faithfulness", value, "a finite faithfulness (lower lr)")
        seen[tuple((theta.detach() > 0).nonzero().flatten().tolist())] = value
        scale = float(grad.abs().max())
        theta = (theta.detach() - lr * grad / scale) if scale > 0 else theta.detach()
        lam *= math.exp(rate * (value - target))
        if progress is not None:
            progress(problem.passes() - before)
    members = tuple(sorted(start))
    f_start = start_faithfulness if start_faithfulness is not None else None
    reaching = sorted((k for k, v in seen.items() if v >= target), key=lambda k: (len(k), -seen[k]))
    best, f_best = members, f_start
    if reaching and (len(reaching[0]) < len(members) or f_start is None):
        confirmed = problem.measure(reaching[:CONFIRMED_SETS])  # the gated forward is exact up to float rounding
        ok = [(k, v) for k, v in zip(reaching[:CONFIRMED_SETS], confirmed, strict=True) if v >= target]
        if ok and len(ok[0][0]) <= len(members):
            best, f_best = ok[0]
    if f_best is None:
        f_best = problem.measure([best])[0]
    trace = [("start", len(members), float(f_start if f_start is not None else f_best)),
             ("masks", len(best), float(f_best))]
    settings = {"steps": steps, "lr": lr, "sparsity": sparsity, "rate": rate, "init": init, "begin": begin,
                "seed": seed, "refine": refine, "sets_seen": len(seen), "final_sparsity": lam,
                "smallest_seen": min((len(k) for k in seen), default=None)}
    if refine:
        polished = refined(problem, list(best), target, start_faithfulness=f_best)
        best, f_best = polished.kept, polished.faithfulness
        trace += list(polished.trace[1:])
        settings["stopped"] = polished.settings["stopped"]
    return SearchResult("masks", tuple(sorted(best)), float(f_best), problem.passes() - before, len(start),
                        tuple(trace), settings)


def _powers(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``, then ``n`` (empty for ``n < 1``)."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return [*out, n] if n >= 1 else []


SEARCHES: dict[str, Callable[..., SearchResult]] = {"ranked": ranked, "refined": refined, "masks": masks}
"""The registered searches by name, each ``(problem, start, target, **options) -> SearchResult``."""


def stop_words(reason: str | None) -> str:
    """Why a search beyond ranking stopped (:attr:`SearchResult.settings` ``["stopped"]``), in words: a pass budget
    leaves a set not known to be 1-minimal."""
    if reason == "max_passes":
        return "stopped by its pass budget, so not known to be 1-minimal"
    return "all its steps ran" if reason is None else f"stopped: {reason}"


def _accepted(name: str, *, users: bool = False) -> set[str]:
    """The options the search ``name`` takes (its keyword parameters); ``users``: those a user sets (not the start's
    faithfulness or the progress, which the caller gives)."""
    import inspect

    given = ("problem", "start", "target") + (("start_faithfulness", "progress") if users else ())
    return {p for p in inspect.signature(SEARCHES[name]).parameters if p not in given}


def check_search_options(where: str, name: str, options: Any) -> dict[str, Any] | None:
    """``options`` for the search ``name`` (validated) checked before any pass: None, or a dict of options the
    search takes, each value checked as the search checks it (:data:`OPTION_CHECKS`); none beside ``"ranked"``."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise validate.fail(where, options, "a dict of the search's options or None")
    if name == "ranked" and options:
        raise validate.fail(where, options, "None beside search='ranked' (the ranked circuit takes no options)")
    accepted = _accepted(name, users=True)
    unknown = sorted(set(options) - accepted, key=str)
    if unknown:
        raise validate.fail(where, validate.given(", ".join(map(str, unknown))),
                            f"options among {', '.join(sorted(accepted)) or '(none)'} (the {name} search's)")
    checks = OPTION_CHECKS.get(name, {})
    return {key: checks[key](value) if key in checks else value for key, value in options.items()}


def run_search(name: str, problem: SearchProblem, start: Sequence[int], target: float, **options: Any,
               ) -> SearchResult:
    """The search ``name`` (:data:`SEARCHES`) with its options; unknown names and options refused."""
    name = validate.option("search", name, tuple(SEARCHES))
    fn = SEARCHES[name]
    accepted = _accepted(name)
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

    def faithfulness(kept: Tensor) -> Tensor:
        ablated = ~kept.view(-1, L, H)
        losses = torch.tensor(ablator.losses(ablated), dtype=torch.float64, device="cpu")
        return faithfulness_of(losses, clean_loss, all_ablated)

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
        return faithfulness_of(loss, clean_loss, all_ablated)

    names = tuple(head_name((layer, h)) for layer in range(L) for h in range(H))
    values = torch.zeros(L * H, device="cpu") if scores is None else scores.detach().float().cpu().reshape(-1)
    return SearchProblem(names, faithfulness, gated, lambda: float(ablator.passes), values)


def search_found(ablator: Any, circuit: Any, name: str, options: dict[str, Any] | None = None, *,
                 necessity: bool = True, intervals: tuple[int, float, int] | None = None, random_sets: int = 0,
                 progress: Any = None) -> Any:
    """The induction circuit ``circuit`` (a :class:`~circuitkit.circuits.faithfulness.Circuit` found by ranking)
    searched further by ``name`` on ``ablator`` (an ``Ablator`` of the same batch and ablation): the same record with
    the searched ``heads`` (in ranking order), their ``faithfulness``, ``circuit_loss``, ``necessity`` and
    intervals (from the per-sequence losses of one more stacked call: nothing, everything, every head outside the
    circuit and, with ``necessity``, only the circuit ablated), ``passes`` grown by the search's, and ``search``
    (the :class:`SearchResult`). The curve stays the ranking's. ``random_sets``: the random baseline measured at
    the searched set's size (:func:`circuitkit.circuits.baseline.measure`); a baseline ``circuit`` holds is of the
    ranked size and is not kept. ``progress(passes)`` as they are spent."""
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
    clean_each = ablator.sequence_losses(sets[0]) if intervals is not None or random_sets else None
    if intervals is not None:
        bounds = circuit_intervals(ablator, ranking, [], heads, clean_each, necessity, *intervals)
        if bounds:
            bounds["curve"] = dict(circuit.intervals.get("curve", {}))
    searched_passes = ablator.passes - before
    if progress is not None:
        progress(searched_passes)
    baseline = None
    if random_sets:
        from circuitkit.circuits.baseline import measure
        from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES

        resamples, level, _ = intervals or (DEFAULT_RESAMPLES, DEFAULT_LEVEL, 0)
        baseline = measure(ablator, heads, circuit.clean_loss, circuit.all_ablated_loss, clean_each, random_sets, 0,
                           level, resamples, progress)
    return replace(circuit, heads=heads, faithfulness=result.faithfulness, circuit_loss=losses[2], necessity=rise,
                   passes=circuit.passes + int(round(searched_passes)), intervals=bounds,
                   search=result, random_baseline=baseline)


__all__ = ["SEARCHES", "SEARCH_NAMES", "SearchProblem", "SearchResult", "induction_problem", "masks", "ranked",
           "refined", "run_search", "search_found"]
