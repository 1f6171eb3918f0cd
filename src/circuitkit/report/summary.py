"""The answer first: which circuit the scan found, in a few sentences with the figures.

Where the scan found a circuit by faithfulness (``scan.verified``), :func:`find_answer` reads it into one
:class:`Answer` (the circuit's heads and the roles the evidence gives them, the edges between them with their exact
path-patching effects, faithfulness and necessity, the faithfulness curve, edges strong in the weights that carry
nothing, the loss, how well the estimates agreed). The report's answer box (:func:`answer_html`) and the terminal
(:func:`answer_lines`) both write that one structure; every figure names its source (exact measurement or
estimate, never mixed in one figure).

Without a circuit (``circuit=False``, or no head matters), :func:`find_story` reads the pattern-called heads of the
scan's roles (:mod:`circuitkit.detect.roles`; a scan that records none ran with the defaults) into a :class:`Story`:
the heads of the role another role feeds (induction heads by default), the heads of the role feeding it
(previous-token heads) and by how much, the loss, what removing the heads does; :func:`story_html` writes it as
escaped HTML (no script: it is also the notebook summary, :func:`circuitkit.report.summary_html`).

A feeding head ``p`` (previous-token) *feeds* head ``i`` of the role it feeds (induction) when ``p`` sits in an
earlier layer; the link's strength is its best Q- or K-composition score (the mechanism of Elhage et al. 2021 is
K-composition), shown next to that mode's random baseline, and its causal effect where the scan's circuit evidence
has the edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from circuitkit._html import escape as _esc
from circuitkit.detect.agreement import MIN_HEADS_TO_JUDGE, judged, selection_text
from circuitkit.detect.roles import DEFAULT_ROLES, Role, feeding_pair
from circuitkit.ranking import Head, head_name
from circuitkit.report import data
from circuitkit.report.figures import MAX_NAMED, ROLE_SHORT, answer_diagram, circuit_diagram, faithfulness_curve

if TYPE_CHECKING:
    from circuitkit.scan_record import ScanRecord as Scan

LINK_MODES = ("K", "Q")
EFFECT_METHODS = {"patched": "path patching", "attribution": "edge attribution"}
"""Composition modes through which a previous-token head can feed an induction head's attention."""


@dataclass(frozen=True)
class Link:
    """A previous-token head ``src`` feeding induction head ``dst`` through ``mode``-composition."""

    src: Head
    dst: Head
    mode: str
    score: float | None
    baseline: float | None
    effect: float | None = None  # causal edge effect (nats) from the circuit evidence, if any
    effect_kind: str | None = None


@dataclass(frozen=True)
class Story:
    """The called heads of two roles: ``induction`` those of the role fed (``fed``; induction by default),
    ``previous`` those of the role feeding it (``feeder``; previous-token), with their scores."""

    induction: list[tuple[Head, float | None]]
    previous: list[tuple[Head, float | None]]
    links: list[Link]
    first_copy: float | None
    repeated_copies: float | None
    removal: list[tuple[Head, float | None, str | None]]  # (head, effect, "ablation" | "attribution" | None)
    best_induction: tuple[Head, float | None] | None  # the top head by the fed role's score when none crossed the bar
    fed: Role = DEFAULT_ROLES[0]
    feeder: Role | None = DEFAULT_ROLES[1]


def _called(scan: Any, score: str) -> tuple[Head, ...]:
    return tuple(tuple(h) for h in (getattr(scan, "called", None) or {}).get(score, ()))


def _story_roles(roles: Sequence[Role]) -> tuple[Role, Role | None]:
    """``(fed, feeder)``: the first role another role feeds and that feeder; else the first role alone."""
    pair = feeding_pair(roles)
    return (pair[1], pair[0]) if pair is not None else (roles[0], None)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _score(scan: Scan, name: str, head: Head) -> float | None:
    if name not in scan.head_scores:
        return None
    return data.number(scan.head_scores[name][head[0], head[1]])


def find_story(scan: Scan) -> Story:
    fed, feeder = _story_roles(data.scan_roles(scan))
    induction = [(h, _score(scan, fed.score, h)) for h in _called(scan, fed.score)]
    previous = [] if feeder is None else [(h, _score(scan, feeder.score, h)) for h in _called(scan, feeder.score)]
    evidence = {(tuple(r.src), tuple(r.dst), str(r.channel).upper()): r for r in data.circuit_rows(scan)}
    links = []
    for dst, _ in induction:
        for src, _ in previous:
            if src[0] >= dst[0]:
                continue
            best = None
            for mode in LINK_MODES:
                if mode not in scan.composition:
                    continue
                value = data.number(scan.composition[mode][src[0], src[1], dst[0], dst[1]])
                baseline = scan.baselines.get(mode)
                mean = None if baseline is None else data.number(baseline.mean)
                excess = None if value is None else value - (mean or 0.0)
                if best is None or (excess is not None and (best[0] is None or excess > best[0])):
                    best = (excess, mode, value, mean)
            if best is None:
                # no composition computed: the link is still the scan's claim, shown without a score
                row = evidence.get((src, dst, "K")) or evidence.get((src, dst, "Q"))
                best = (None, "K" if row is None else str(row.channel).upper(), None, None)
            _, mode, value, mean = best
            row = evidence.get((src, dst, mode))
            effect, kind = data.edge_effect(row) if row is not None else (None, None)
            links.append(Link(src, dst, mode, value, mean, effect, kind))
    links.sort(key=lambda link: (-(link.score or 0.0) + (link.baseline or 0.0), link.src, link.dst))
    best_induction = None
    if not induction and fed.score in scan.head_scores:
        top = scan.head_scores.top(fed.score, 1)
        best_induction = (top[0][0], data.number(top[0][1])) if top else None
    first, repeated = data.loss_figures(scan)
    removal = [(h, *data.effect_on(scan, h)) for h, _ in induction]
    return Story(induction, previous, links, first, repeated, removal, best_induction, fed, feeder)


# ---------------------------------------------------------------------------------------------- text
def _num(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _head(head: Head) -> str:
    name = head_name(head)
    return f'<span class="ck-head" data-head="{name}" tabindex="0">{name}</span>'


def _listing(items: list[tuple[Head, float | None]], label: str) -> str:
    shown = [f"{_head(h)} ({label} <b>{_num(v)}</b>)" for h, v in items[:MAX_NAMED]]
    if len(items) > MAX_NAMED:
        shown.append(f"and {len(items) - MAX_NAMED} more")
    return ", ".join(shown)


def sentences(scan: Scan, story: Story) -> list[str]:
    """The summary as HTML sentences (every value escaped or numeric)."""
    out = []
    fed, feeder = story.fed, story.feeder
    if story.induction:
        text = f"<b>{_esc(fed.title)} heads:</b> {_listing(story.induction, _esc(fed.score))}."
        if story.previous and feeder is not None:
            label = _esc(data.score_short(scan, feeder.score))
            text += f" <b>{_esc(feeder.title)} heads:</b> {_listing(story.previous, label)}."
        out.append(text)
        if story.links:
            parts = []
            for link in story.links[:MAX_NAMED]:
                part = f"{_head(link.src)} &rarr; {_head(link.dst)} {link.mode} <b>{_num(link.score)}</b>"
                if link.effect is not None:
                    part += f", effect <b>{link.effect:+.2f}</b>"
                parts.append(part)
            more = f"; {len(story.links) - MAX_NAMED} more" if len(story.links) > MAX_NAMED else ""
            shown = story.links[:MAX_NAMED]
            baselines = sorted({(link.mode, link.baseline) for link in shown if link.baseline is not None})
            randoms = ", ".join(f"{m} {b:.2f}" for m, b in baselines)
            notes = [f"composition score; random {randoms}"] if baselines else []
            kinds = sorted({link.effect_kind for link in shown if link.effect_kind})
            if kinds:
                methods = " / ".join(_esc(EFFECT_METHODS.get(k, k)) for k in kinds)
                notes.append(f"edge effect on the loss in nats by {methods}")
            note = f" ({'; '.join(notes)})" if notes else ""
            out.append(f"<b>They connect</b>{note}: {'; '.join(parts)}{more}.")
        elif story.previous and feeder is not None:
            out.append(_esc(f"No {feeder.name} head sits in an earlier layer than {_article(fed.name)} {fed.name} "
                            "head."))
    elif story.best_induction is not None:
        head, value = story.best_induction
        out.append(
            f"<b>No {_esc(fed.name)} circuit found:</b> no head crosses the {_esc(fed.score)} threshold; the best is "
            f"{_head(head)} with {_esc(fed.score)} score <b>{_num(value)}</b>."
        )
    if story.first_copy is not None and story.repeated_copies is not None:
        drop = story.first_copy - story.repeated_copies
        verdict = "in-context copying works" if drop > 0.5 else "little in-context copying"
        bounds = (getattr(scan, "intervals", None) or {}).get("induction_loss", {})
        repeated_ci, first_ci = (_esc("".join(v for _, v in _ci(bounds.get(key))))
                                 for key in ("repeated_copies", "first_copy"))
        out.append(
            f"<b>Loss</b> on the repeated copies <b>{_num(story.repeated_copies)}</b>{repeated_ci} nats vs "
            f"<b>{_num(story.first_copy)}</b>{first_ci} on the first copy ({verdict})."
        )
    removal = [(h, v, kind) for h, v, kind in story.removal if v is not None]
    if removal:
        parts = [f"{_head(h)} <b>{v:+.2f}</b>{'' if kind == 'ablation' else ' (estimated)'}"
                 for h, v, kind in removal[:MAX_NAMED]]
        method = scan.ablation.method if scan.ablation is not None else (
            scan.attribution.method if scan.attribution is not None else "")
        text = f"<b>Removing</b> ({_esc(method)} ablation) raises the repeated-copies loss by {', '.join(parts)} nats"
        agreement = scan.agreement
        if agreement is not None and agreement.spearman is not None:
            text += (f"; attribution agrees with exact ablation at Spearman <b>{agreement.spearman:.2f}</b>"
                     + _esc("".join(v for _, v in _agreement_scope(scan, agreement.n_exact))))
            if agreement.largest_miss is not None:
                head, exact, estimate = agreement.largest_miss
                text += (f" (largest miss {_head(head)}: exact <b>{exact:+.2f}</b>, estimated "
                         f"<b>{estimate:+.2f}</b>)")
        out.append(text + ".")
    together = [(label, value) for label, value in scan.circuit_ablation.items() if value is not None]
    if together:
        parts = [f"the {_esc(label)} <b>{value:+.2f}</b>" for label, value in together]
        after = ""
        if story.repeated_copies is not None and fed.group in scan.circuit_ablation:
            rise = scan.circuit_ablation[fed.group]
            after = (f" (with the {_esc(fed.group)} gone the repeats cost "
                     f"<b>{_num(story.repeated_copies + rise)}</b>")
            after += f" nats, first copy {_num(story.first_copy)})" if story.first_copy is not None else " nats)"
        out.append(f"<b>Ablated together</b>, the loss rises by: {', '.join(parts)} nats{after}.")
    return out


def model_line(scan: Scan) -> str:
    m = scan.model
    kv = f" ({m.n_kv_heads} key/value heads, grouped-query)" if m.n_kv_heads and m.n_kv_heads != m.n_heads else ""
    family = f", {_esc(m.family)}" if m.family else ""
    return (
        f"<b>{_esc(m.name)}</b>{family}: {m.n_layers} layers &times; {m.n_heads} heads{kv}, "
        f"d_model {m.d_model}, d_head {m.d_head}" + (f", vocabulary {m.d_vocab}" if m.d_vocab else "")
    )


def story_html(scan: Scan, *, diagram: bool = True) -> str:
    """The summary block: sentences and (``diagram``) the circuit diagram and faithfulness curve, as escaped HTML,
    no script. On the verified circuit where the scan found one (:func:`answer_html`)."""
    answer = find_answer(scan)
    if answer is not None:
        text = "".join(s if s.startswith("<ul") else f"<p>{s}</p>" for s in answer_html(answer))
        figures = ""
        if diagram:  # beside the text, one above the other: the curve stays in view beside a long member list
            drawn = answer_diagram(answer)
            searched = None if answer.search is None else (answer.search.search, answer.faithfulness)
            curve = faithfulness_curve(answer.curve, answer.target, len(answer.circuit), answer.n_total,
                                       answer.curve_ci, _baseline_mark(answer), searched=searched)
            tall = int(drawn.split('height="', 1)[1].split('"', 1)[0]) > TALL_DIAGRAM
            figures = f'<div class="ck-answer-figures">{curve + drawn if tall else drawn + curve}</div>'
        return f'<div class="ck-answer"><div class="ck-answer-text">{text}</div>{figures}</div>'
    story = find_story(scan)
    text = "".join(f"<p>{s}</p>" for s in sentences(scan, story))
    error = getattr(scan, "verified_error", None)
    if error:
        text = f"<p><b>No circuit found by faithfulness:</b> {_esc(error.removeprefix('faithfulness: '))}</p>" + text
    figure = circuit_diagram(story) if diagram else ""
    return f'<div class="ck-answer"><div class="ck-answer-text">{text}</div>{figure}</div>'


TALL_DIAGRAM = 480
"""A circuit diagram taller than this (px: a circuit over eight layers or more) goes below the faithfulness curve,
which then stays in view."""


def _baseline_mark(answer: Any) -> tuple[float, float, float] | None:
    """``(mean, lo, hi)`` of the uniform random sets for the curve: the interval, else the sets' spread."""
    baseline = getattr(answer, "random_baseline", None)
    if baseline is None:
        return None
    low, high = baseline.uniform.interval or baseline.uniform.spread
    return baseline.uniform.mean, low, high


# ---------------------------------------------------------------------------------------------- the answer
@dataclass(frozen=True)
class AnswerEdge:
    """An edge between two circuit heads: its exact ``effect`` (path patching, nats), the first-order ``estimate``
    (edge attribution, nats; None where not computed) and the ``composition`` score."""

    src: Head
    dst: Head
    channel: str
    effect: float
    estimate: float | None
    composition: float | None
    ci: tuple[float, float] | None = None  # the effect's bootstrap interval over the batch's sequences

    @property
    def name(self) -> str:
        return f"{head_name(self.src)} -> {head_name(self.dst)} {self.channel.upper()}"


@dataclass(frozen=True)
class Answer:
    """The scan's answer on its verified circuit (see the module docstring). Losses and effects in nats."""

    circuit: tuple[tuple[Head, tuple[str, ...]], ...]  # heads in ranking order, each with its roles
    n_total: int
    faithfulness: float
    target: float
    necessity: float | None
    method: str
    passes: int
    ranked_by: str  # "effect" | "joint"
    curve: tuple[tuple[int, float], ...]
    edges: tuple[AnswerEdge, ...]  # carrying edges between circuit heads, largest |effect| first
    n_silent: int  # patched edges between circuit heads that carry nothing
    # (src, dst, channel, composition, effect, "patched" (exact) | "attribution" (estimate))
    weight_only: tuple[tuple[Head, Head, str, float | None, float | None, str], ...]
    outside: tuple[tuple[Head, str, float | None], ...]  # pattern-called heads not in the circuit
    first_copy: float | None
    repeated_copies: float | None
    # (spearman, n_exact, largest miss, the parts after the figure: its interval, over which heads, or "too few")
    agreement: tuple[float, int, tuple[Head, float, float] | None, tuple[tuple[str, Any], ...]] | None
    attribution: str  # "gradient" | "ig", with steps
    top_k: int = 5  # the circuit's edges named (the scan's edges_listed setting)
    # bootstrap intervals over the batch's sequences ((lo, hi); None where not computed) and how they were made
    faithfulness_ci: tuple[float, float] | None = None
    necessity_ci: tuple[float, float] | None = None
    curve_ci: dict[int, tuple[float, float] | None] | None = None
    first_copy_ci: tuple[float, float] | None = None
    repeated_copies_ci: tuple[float, float] | None = None
    intervals: tuple[float, int, int] | None = None  # (level, n_resamples, sequences)
    random_baseline: Any = None  # circuits.baseline.RandomBaseline where measured
    stability: Any = None  # circuits.stability.Stability where measured
    evaluation: Any = None  # the circuit on a held-out batch (circuits.heldout.held_out's dict) where measured
    search: Any = None  # circuits.search.SearchResult where a search beyond ranking chose the circuit
    edges_unmeasured: str | None = None  # why no edge between the circuit's heads was measured (None: some were)
    # head name -> what it does, from the scan's figures (data.circuit_explanations)
    explanations: Mapping[str, str] = field(default_factory=dict)


def edges_unmeasured(scan: Scan, heads: tuple[Head, ...], patched: int) -> str | None:
    """Why the scan measured no edge between the circuit's ``heads`` (``patched``: the path-patched edges between
    them), or None where it did: an answer says only what was measured."""
    if patched:
        return None
    if getattr(scan, "circuit", None) is None:
        if scan.model.n_layers < 2:
            return "the edges were not measured: a one-layer model has no edge between heads"
        if getattr(scan.settings, "edge_attribution_steps", None) is None:
            return ("the edges were not measured: this model's heads do not add into the residual stream one by one "
                    "(a norm or a scale after the attention output), so one head's path into another cannot be "
                    "isolated; head-level figures are not affected")
        return "the edges were not measured (the scan holds no edge evidence)"
    if len({layer for layer, _ in heads}) < 2:
        return "the circuit's heads are all in one layer: no edge runs between them"
    return "no edge between the circuit's heads was path-patched (none among the edges measured)"


def find_answer(scan: Scan) -> Answer | None:
    """:class:`Answer` of a scan with a verified circuit; None without one."""
    from circuitkit.circuits.evidence import CARRIES_NOTHING_FRACTION

    verified = getattr(scan, "verified", None)
    if verified is None:
        return None
    roles = getattr(verified, "roles", {}) or {}
    circuit = tuple((tuple(h), tuple(role for role, heads in roles.items() if tuple(h) in heads))
                    for h in verified.heads)
    rows = data.circuit_edges(scan)
    largest = max((abs(float(r.patched)) for r in rows), default=0.0)
    carrying = [r for r in rows if largest > 0 and abs(float(r.patched)) >= CARRIES_NOTHING_FRACTION * largest]
    bounds = getattr(scan, "intervals", None) or {}
    circuit_bounds = getattr(verified, "intervals", None) or {}
    edge_bounds = bounds.get("edges", {})
    edges = tuple(AnswerEdge(tuple(r.src), tuple(r.dst), str(r.channel), float(r.patched),
                             data.number(r.attribution), data.number(r.composition),
                             edge_bounds.get((tuple(r.src), tuple(r.dst), str(r.channel))))
                  for r in carrying)
    weight_only = tuple((tuple(r.src), tuple(r.dst), str(r.channel), data.number(r.composition),
                         *data.edge_effect(r)) for r in data.circuit_rows(scan) if getattr(r, "weight_only", False))
    members = {h for h, _ in circuit}
    outside = []
    for score in dict.fromkeys(role.score for role in data.scan_roles(scan)):
        for h in _called(scan, score):
            if h not in members:
                outside.append((h, score, _score(scan, score, h)))
    first, repeated = data.loss_figures(scan)
    agreement = None
    if scan.agreement is not None and scan.agreement.spearman is not None:
        agreement = (scan.agreement.spearman, scan.agreement.n_exact, scan.agreement.largest_miss,
                     tuple(_agreement_scope(scan, scan.agreement.n_exact)))
    settings = scan.settings
    method = getattr(settings, "attribution_method", "gradient")
    steps = getattr(settings, "attribution_steps", 1)
    return Answer(
        circuit=circuit, n_total=scan.model.n_layers * scan.model.n_heads,
        faithfulness=float(verified.faithfulness), target=float(verified.target),
        necessity=None if verified.necessity is None else float(verified.necessity), method=verified.method,
        passes=int(verified.passes), ranked_by=getattr(verified, "ranked_by", "effect"),
        curve=tuple((p.size, float(p.faithfulness)) for p in verified.curve),
        edges=edges, n_silent=len(rows) - len(carrying), weight_only=weight_only, outside=tuple(outside),
        first_copy=first, repeated_copies=repeated, agreement=agreement,
        top_k=int(scan.settings.edges_listed),
        attribution=f"integrated gradients, {steps} steps" if method == "ig" else "first-order gradient",
        faithfulness_ci=circuit_bounds.get("faithfulness"), necessity_ci=circuit_bounds.get("necessity"),
        curve_ci=circuit_bounds.get("curve"),
        first_copy_ci=bounds.get("induction_loss", {}).get("first_copy"),
        repeated_copies_ci=bounds.get("induction_loss", {}).get("repeated_copies"),
        intervals=(float(getattr(settings, "ci_level", 0.95)), int(getattr(settings, "n_resamples", 0)),
                   int(settings.batch)) if (bounds or circuit_bounds) else None,
        random_baseline=getattr(verified, "random_baseline", None), stability=getattr(verified, "stability", None),
        evaluation=getattr(verified, "evaluation", None), search=getattr(verified, "search", None),
        edges_unmeasured=edges_unmeasured(scan, tuple(h for h, _ in circuit), len(rows)),
        explanations=data.circuit_explanations(scan),
    )


RANKED_BY = {"effect": "their single-head ablation effect", "joint": "their joint-path attribution"}


def _roles_text(roles: tuple[str, ...]) -> str:
    """A member's roles as the circuit line writes them after its name ("" without one: its line under Members
    says what it does)."""
    return "/".join(ROLE_SHORT.get(r, r) for r in roles)


def _ci(interval: tuple[float, float] | None, fmt: str = ".2f") -> list[tuple[str, Any]]:
    """The parts `` [lo, hi]`` after a figure (none without an interval)."""
    if interval is None:
        return []
    return [("text", f" [{format(interval[0], fmt)}, {format(interval[1], fmt)}]")]


def _held_out_parts(answer: Answer) -> list[tuple[str, Any]]:
    """The circuit's figures on the held-out batch, beside the search batch's."""
    held = answer.evaluation
    seed = "" if held.get("seed") is None else f", seed {held['seed']}"
    where = f"on {held['sequences']} fresh sequences of the same kind{seed}, which the search did not see"
    if held.get("faithfulness") is None:
        return [("text", f"{where}: not measured ({held.get('note')})")]
    parts: list[tuple[str, Any]] = [("text", f"{where}, the same heads reach faithfulness "),
                                    ("num", f"{held['faithfulness']:.2f}"),
                                    ("text", f" (on the search batch {answer.faithfulness:.2f}; target "
                                             f"{answer.target:.2f} applied there)")]
    if held.get("necessity") is not None:
        parts += [("text", "; necessity "), ("num", f"{held['necessity']:+.2f}"), ("text", " nats")]
    return parts


def _agreement_scope(scan: Any, n_exact: int) -> list[tuple[str, Any]]:
    """The parts after the agreement's Spearman: its interval over the sequences, over which heads it is taken, or
    that they are too few to judge (:mod:`circuitkit.detect.agreement`)."""
    settings = scan.settings
    which = selection_text(getattr(settings, "ablate", "top"), getattr(settings, "ablate_top", 0))
    if not judged(n_exact):
        return [("text", f" over {n_exact} heads ({which}): too few heads to judge (fewer than "
                         f"{MIN_HEADS_TO_JUDGE})")]
    return [*_ci((getattr(scan, "intervals", None) or {}).get("agreement")),
            ("text", f" over {n_exact} heads ({which})")]


def answer_parts(answer: Answer) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The answer as (label, [(kind, value)]) sentences: ``kind`` ``"text"`` (plain words), ``"head"`` (a head),
    ``"member"`` (a head of the Members sentence, its explanation the text after it),
    ``"num"`` (a figure, already formatted). :func:`answer_html` and :func:`answer_lines` both write these."""
    out: list[tuple[str, list[tuple[str, Any]]]] = []
    parts: list[tuple[str, Any]] = [("text", f"{len(answer.circuit)} of {answer.n_total} heads: ")]
    for i, (head, roles) in enumerate(answer.circuit):
        if i:
            parts.append(("text", ", "))
        parts += [("head", head)] + ([("text", f" {_roles_text(roles)}")] if roles else [])
    out.append(("Circuit", parts))
    if answer.explanations:
        members = []
        for head in sorted(h for h, _ in answer.circuit):  # in layer order, as the diagram draws them
            members += [("member", head), ("text", answer.explanations.get(head_name(head), ""))]
        out.append(("Members", members))
    faith = [("num", f"{answer.faithfulness:.2f}"), *_ci(answer.faithfulness_ci),
             ("text", f" (target {answer.target:.2f}; exact: every other head {answer.method}-ablated, the circuit "
                      f"alone recovers {100 * answer.faithfulness:.0f}% of what all heads do; heads added in the "
                      f"order of {RANKED_BY.get(answer.ranked_by, answer.ranked_by)}; "
                      f"{answer.passes} forward passes)")]
    found = answer.search
    if found is not None:
        from circuitkit.circuits.search import stop_words

        budget = f", {stop_words('max_passes')}" if found.settings.get("stopped") == "max_passes" else ""
        faith.append(("text", f"; the {found.search} search from the ranked top {found.start} chose these "
                              f"{found.size} heads ({found.passes:.0f} of those passes{budget}): the curve is the "
                              f"ranking's, its point at {found.size} heads the top {found.size} by rank"))
    if answer.necessity is not None:
        faith += [("text", ". Necessity: ablating only the circuit raises the loss by "),
                  ("num", f"{answer.necessity:+.2f}"), *_ci(answer.necessity_ci, "+.2f"), ("text", " nats (exact)")]
    out.append(("Faithfulness", faith))
    if answer.evaluation is not None:
        out.append(("Held out", _held_out_parts(answer)))
    if answer.random_baseline is not None:
        baseline = answer.random_baseline
        parts = [("text", f"faithfulness of {baseline.n_sets} random sets of {baseline.size} heads: uniform ")]
        for i, kind in enumerate((baseline.uniform, baseline.layered)):
            if i:
                parts.append(("text", "; with the circuit's heads per layer "))
            parts += [("num", f"{kind.mean:.2f}"), *_ci(kind.interval),
                      ("text", f" (sets from {kind.spread[0]:.2f} to {kind.spread[1]:.2f})")]
        parts.append(("text", f" ({baseline.passes} forward passes)"))
        out.append(("Random sets", parts))
    if answer.stability is not None:
        stability = answer.stability
        parts = [("text", f"rerun on {stability.n_resamples} bootstrap resamples of the batch, mean pairwise "
                          "Jaccard "), ("num", "n/a" if stability.jaccard is None else f"{stability.jaccard:.2f}"),
                 ("text", " (stable from 0.80); heads in the resampled circuits: ")]
        for i, (head, share) in enumerate(stability.ranked()[:MAX_EDGES]):
            if i:
                parts.append(("text", ", "))
            parts += [("head", head), ("text", " "), ("num", f"{100 * share:.0f}%")]
        parts.append(("text", f" ({stability.passes} forward passes)"))
        out.append(("Stability", parts))
    if answer.edges:
        parts = [("text", "exact effect on the loss, path patching, nats: ")]
        for i, e in enumerate(answer.edges[:answer.top_k]):
            if i:
                parts.append(("text", "; "))
            parts += [("head", e.src), ("text", " \u2192 "), ("head", e.dst),
                      ("text", f" {e.channel.upper()} "), ("num", f"{e.effect:+.2f}"), *_ci(e.ci, "+.2f")]
        if len(answer.edges) > answer.top_k:
            parts.append(("text", f"; {len(answer.edges) - answer.top_k} more"))
        if answer.n_silent:
            parts.append(("text", f" ({answer.n_silent} other patched edges between circuit heads carry nothing)"))
        out.append(("Edges", parts))
    elif answer.edges_unmeasured is not None:
        if len(answer.circuit) > 1:
            out.append(("Edges", [("text", answer.edges_unmeasured)]))
    elif len(answer.circuit) > 1 and answer.n_silent:
        out.append(("Edges", [("text", f"no edge between the circuit's heads carries a measurable effect "
                                       f"({answer.n_silent} path-patched)")]))
    elif len(answer.circuit) > 1:  # nothing patched
        out.append(("Edges", [("text", "not measured: no edge between the circuit's heads was path-patched")]))
    if answer.weight_only:
        parts = [("text", "composition score vs effect on the loss (nats): ")]
        for i, (src, dst, channel, comp, effect, kind) in enumerate(answer.weight_only[:MAX_EDGES]):
            if i:
                parts.append(("text", "; "))
            source = "exact, path patching" if kind == "patched" else "estimate, edge attribution"
            parts += [("head", src), ("text", " \u2192 "), ("head", dst), ("text", f" {channel.upper()} composition "),
                      ("num", "n/a" if comp is None else f"{comp:.2f}"), ("text", ", effect "),
                      ("num", "n/a" if effect is None else f"{effect:+.2f}"), ("text", f" ({source})")]
        out.append(("Strong in the weights, carries nothing", parts))
    if answer.outside:
        parts = [("text", "pattern score above threshold, not needed for faithfulness: ")]
        for i, (head, score, value) in enumerate(answer.outside[:MAX_EDGES]):
            if i:
                parts.append(("text", ", "))
            parts += [("head", head), ("text", f" ({score} "), ("num", _num(value)), ("text", ")")]
        out.append(("Outside the circuit", parts))
    if answer.first_copy is not None and answer.repeated_copies is not None:
        verdict = "in-context copying works" if answer.first_copy - answer.repeated_copies > 0.5 else \
            "little in-context copying"
        out.append(("Loss", [("text", "repeated copies "), ("num", f"{answer.repeated_copies:.2f}"),
                             *_ci(answer.repeated_copies_ci), ("text", " nats vs "),
                             ("num", f"{answer.first_copy:.2f}"), *_ci(answer.first_copy_ci),
                             ("text", f" on the first copy ({verdict})")]))
    if answer.agreement is not None:
        spearman, n_exact, miss, scope = answer.agreement
        parts = [("text", f"head attribution ({answer.attribution}) vs exact ablation: Spearman "),
                 ("num", f"{spearman:.2f}"), *scope]
        if miss is not None:
            head, exact, estimate = miss
            parts += [("text", "; largest miss "), ("head", head), ("text", " exact "), ("num", f"{exact:+.2f}"),
                      ("text", ", estimated "), ("num", f"{estimate:+.2f}")]
        out.append(("Estimates", parts))
    if answer.intervals is not None:
        level, resamples, sequences = answer.intervals
        out.append(("Intervals", [("text", f"[lo, hi] beside a figure: its {100 * level:g}% percentile bootstrap "
                                           f"interval over the batch's {sequences} sequences ({resamples} resamples, "
                                           "seed 0; from the passes above, no extra pass)")]))
    return out


MAX_EDGES = 6
"""Weight-only edges and heads outside the circuit named in an answer sentence (the circuit's edges: the scan's
``top_k``); the rest are counted."""


def answer_html(answer: Answer) -> list[str]:
    """The answer's sentences as escaped HTML (heads clickable, figures bold)."""
    out = []
    for label, parts in answer_parts(answer):
        if label == "Members":  # a list, one member a line (story_html writes it as it is, not in a <p>)
            items = "".join(f"<li>Member {_head(head)}: {_esc(text)}.</li>" for head, text in _members(parts))
            out.append(f'<ul class="ck-members" aria-label="what each member does">{items}</ul>')
            continue
        body = "".join(_head(v) if kind == "head" else f"<b>{_esc(v)}</b>" if kind == "num" else _esc(v)
                       for kind, v in parts)
        out.append(f"<b>{_esc(label)}</b>: {body}.")
    return out


def _members(parts: list[tuple[str, Any]]) -> list[tuple[Head, str]]:
    """The Members sentence's ``(head, explanation)`` pairs."""
    return [(head, text) for (_, head), (_, text) in zip(parts[::2], parts[1::2], strict=True)]


SEARCH_SKIPPED = "circuit=True"
"""What turns the circuit search on in library use (the CLI names its own flags instead)."""


def no_circuit_line(scan: Scan, skipped: str | None = None) -> str:
    """Why the scan has no circuit: the search ran and found none (its reason, said once), or it never ran
    (``skipped``: the flag that skipped it, e.g. ``"--quick"``; default: the library argument)."""
    error = getattr(scan, "verified_error", None)
    if error:
        reason = error.removeprefix("faithfulness: ")
        return f"No circuit found by faithfulness: {reason}"
    ran = {stage.name for stage in getattr(scan, "stages", ())}
    if "circuit" in ran:
        return "No circuit found by faithfulness."
    if skipped:
        return f"Circuit search skipped ({skipped}); run without {skipped} to search for a circuit."
    return f"Circuit search skipped (circuit=False); pass {SEARCH_SKIPPED} to search for a circuit."


def answer_lines(scan: Scan, skipped: str | None = None) -> list[str]:
    """The answer as plain text lines (the terminal's), from the same :class:`Answer` as the report's box; the
    pattern-called heads with a note where the scan has no circuit (:func:`no_circuit_line`; ``skipped``: the
    flag that skipped the search)."""
    answer = find_answer(scan)
    if answer is None:
        lines = [no_circuit_line(scan, skipped)]
        called = "; ".join(f"{role.name} {', '.join(head_name(h) for h in _called(scan, role.score)) or 'none'}"
                           for role in data.scan_roles(scan))
        lines.append(f"Heads by pattern score alone: {called}.")
        return lines
    lines = []
    for label, parts in answer_parts(answer):
        if label == "Members":  # one line per member
            lines += [f"Member {head_name(head)}: {text}." for head, text in _members(parts)]
        else:
            lines.append(f"{label}: " + "".join(head_name(v) if kind == "head" else str(v) for kind, v in parts)
                         + ".")
    return lines


__all__ = ["Answer", "AnswerEdge", "Link", "Story", "answer_html", "answer_lines", "answer_parts", "find_answer",
           "find_story", "model_line", "no_circuit_line", "sentences", "story_html"]
