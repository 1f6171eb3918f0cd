"""The answer first: which circuit the scan found, in a few sentences with the figures.

:func:`find_story` reads the scan into a :class:`Story` (induction heads, the previous-token heads that feed
them and by how much, the loss on the first copy vs the repeated copies, what removing the heads does);
:func:`story_html` writes it as escaped HTML (no script: it is also the notebook summary,
:func:`circuitkit.report.summary_html`).

A previous-token head ``p`` *feeds* induction head ``i`` when ``p`` sits in an earlier layer; the link's
strength is its best Q- or K-composition score (the mechanism of Elhage et al. 2021 is K-composition), shown
next to that mode's random baseline, and its causal effect where the scan's circuit evidence has the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuitkit._html import escape as _esc
from circuitkit.ranking import Head, head_name
from circuitkit.report import data

if TYPE_CHECKING:
    from circuitkit.scan_types import Scan

MAX_NAMED = 4
"""Heads named per role in the summary sentences and diagram; the rest are counted ("and 3 more")."""
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
    induction: list[tuple[Head, float | None]]
    previous: list[tuple[Head, float | None]]
    links: list[Link]
    first_copy: float | None
    repeated_copies: float | None
    removal: list[tuple[Head, float | None, str | None]]  # (head, effect, "ablation" | "attribution" | None)
    best_induction: tuple[Head, float | None] | None  # the top induction-score head when none crossed the bar


def _score(scan: Scan, name: str, head: Head) -> float | None:
    if name not in scan.head_scores:
        return None
    return data.number(scan.head_scores[name][head[0], head[1]])


def find_story(scan: Scan) -> Story:
    induction = [(h, _score(scan, "induction", h)) for h in scan.induction_heads]
    previous = [(h, _score(scan, "previous_token", h)) for h in scan.previous_token_heads]
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
    if not induction and "induction" in scan.head_scores:
        top = scan.head_scores.top("induction", 1)
        best_induction = (top[0][0], data.number(top[0][1])) if top else None
    first, repeated = data.loss_figures(scan)
    removal = [(h, *data.effect_on(scan, h)) for h, _ in induction]
    return Story(induction, previous, links, first, repeated, removal, best_induction)


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
    if story.induction:
        text = f"<b>Induction heads:</b> {_listing(story.induction, 'induction')}."
        if story.previous:
            text += f" <b>Previous-token heads:</b> {_listing(story.previous, 'prev')}."
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
        elif story.previous:
            out.append("No previous-token head sits in an earlier layer than an induction head.")
    elif story.best_induction is not None:
        head, value = story.best_induction
        out.append(
            f"<b>No induction circuit found:</b> no head crosses the induction threshold; the best is "
            f"{_head(head)} with induction score <b>{_num(value)}</b>."
        )
    if story.first_copy is not None and story.repeated_copies is not None:
        drop = story.first_copy - story.repeated_copies
        verdict = "in-context copying works" if drop > 0.5 else "little in-context copying"
        out.append(
            f"<b>Loss</b> on the repeated copies <b>{_num(story.repeated_copies)}</b> nats vs "
            f"<b>{_num(story.first_copy)}</b> on the first copy ({verdict})."
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
            text += (f"; attribution agrees with exact ablation at Spearman <b>{agreement.spearman:.2f}</b> over "
                     f"{agreement.n_exact} heads")
            if agreement.largest_miss is not None:
                head, exact, estimate = agreement.largest_miss
                text += (f" (largest miss {_head(head)}: exact <b>{exact:+.2f}</b>, estimated "
                         f"<b>{estimate:+.2f}</b>)")
        out.append(text + ".")
    together = [(label, value) for label, value in scan.circuit_ablation.items() if value is not None]
    if together:
        parts = [f"the {_esc(label)} <b>{value:+.2f}</b>" for label, value in together]
        after = ""
        if story.repeated_copies is not None and "induction heads" in scan.circuit_ablation:
            rise = scan.circuit_ablation["induction heads"]
            after = f" (with the induction heads gone the repeats cost <b>{_num(story.repeated_copies + rise)}</b>"
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
    """The summary block: sentences and (``diagram``) the circuit diagram, as escaped HTML, no script."""
    from circuitkit.report.figures import circuit_diagram

    story = find_story(scan)
    text = "".join(f"<p>{s}</p>" for s in sentences(scan, story))
    figure = circuit_diagram(story) if diagram else ""
    return f'<div class="ck-answer"><div class="ck-answer-text">{text}</div>{figure}</div>'


__all__ = ["Link", "Story", "find_story", "model_line", "sentences", "story_html"]
