"""``scan_task(model, task) -> TaskScan``: a task's circuit found and measured, in declared stages.

Stages (declared in :mod:`circuitkit.tasks.stages`, each planned in forward passes of the pairs before the first
pass and shown by the induction scan's :class:`~circuitkit.progress.Progress`; a backward pass counts two)::

    clean        one forward: every sender's output, the clean metric, direct logit attribution (a backward
                 through the final norm and the unembedding only)
    corrupted    one forward: every sender's output on the corrupted prompts, the corrupted metric; runs only
                 where EAP-IG's points do not start at the corrupted run (``ig_points="right"``, per-query-head
                 key/value edges, families without edges)
    attribute    EAP-IG: ``steps`` interpolation points, one stacked forward + backward (``3 * steps``); its first
                 point, ``alpha = 0``, is the corrupted run, read from that copy of the pass
    nodes        the node circuit: all nodes patched, the exact sizes (past 16 nodes a coarse search first), necessity
    search       (opt-in) a search beyond ranking from the ranked circuit: refined drops and swaps, or masks
    random-sets  (opt-in) random head sets of the circuit's size (:mod:`circuitkit.tasks.robustness`)
    stability    (opt-in) the node search rerun on bootstrap resamples of the pairs
    edges        the edge circuit: MIB's sizes in stacked copies, bisection, the strongest edges' exact effects
    edge-search  (opt-in) the edge circuit's dangling edges pruned, then refined drops within a pass budget
    held-out     the circuit on the pairs the search did not use (forward passes only)

``circuitkit.scan(model, task=...)`` and ``circuitkit scan MODEL --task NAME|FILE`` run this for any task other
than ``induction`` (which the induction scan measures with its own loss).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits.search import SEARCH_NAMES, check_search_options, search_estimate, stop_words
from circuitkit.graph.metrics import dla_meaning, metric_label, metric_units, read_mask
from circuitkit.graph.nodes import DEFAULT_KV_EDGES, KV_EDGES
from circuitkit.graph.runner import DEFAULT_IG_POINTS, EDGES_UNDEFINED, IG_POINTS, TaskRunner, check_hooks
from circuitkit.graph.task import Task, check_prepend_bos
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import head_name
from circuitkit.scan_record import ScanResult, StageRecord
from circuitkit.stage import run_planned
from circuitkit.tasks.circuit import NODE_RANKINGS, RANKS, TaskCircuit, edge_intervals, effect_intervals
from circuitkit.tasks.memory import check_task_memory, logit_positions, node_widths
from circuitkit.tasks.other_set import circuit_intervals
from circuitkit.tasks.record import TASK_FORMAT
from circuitkit.tasks.roles import member_explanations, rules_said
from circuitkit.tasks.search import (
    DEFAULT_EDGE_SEARCH_PASSES,
    EDGE_SEARCH_NAMES,
)
from circuitkit.tasks.single_heads import DEFAULT_ABLATE, check_ablate, planned_heads
from circuitkit.tasks.stages import (
    TASK_STAGES,
    PlanInputs,
    TaskOptions,
    TaskScanState,
    count_of,
    task_plan,
    task_progress,
)

DEFAULT_HOLDOUT = 0.5
"""Share of a task's pairs held out for evaluation by default (seeded): the circuit is searched on the rest and its
faithfulness reported on both (MIB's discovery and evaluation splits)."""
MIN_SPLIT_PAIRS = 8
"""Fewest pairs that are split (four a side): below it every pair serves the search and the answer says so."""
TARGETS_ON = ("discovery", "evaluation")
DEFAULT_IG_STEPS = 3
"""EAP-IG interpolation points (``k / steps`` of the way from the corrupted to the clean input embeddings), all in
one stacked forward + backward pass."""


@dataclass(frozen=True, eq=False)
class TaskScan(ScanResult):
    """A task scan: ``task``; per-pair metric on the clean and corrupted prompts (``clean`` / ``corrupted``
    ``[pair]``); ``dla`` (each head's direct contribution to logit(answer) - logit(wrong) through the final norm
    with its scale frozen at the clean run's, ``[layer, head]``; ``dla_mlp`` ``[layer]`` or None); ``scores``
    (each head's EAP-IG node score, ``[layer, head]``; ``scores_mlp``); ``head_scores``: the task's own head scores
    by name (:attr:`Task.attention_scores`, ``[layer, head]``); ``pattern_scores``: the registered pattern scores
    (:mod:`circuitkit.detect`) on the task's clean prompts, where their targets occur there; ``patterns``: every
    head's attention on the first clean prompt ``[layer, head, q, k]`` and its ``tokens``; ``circuit``;
    ``stages``."""

    model: Any  # circuitkit.scan_record.ModelSummary
    task: Task
    clean: Tensor
    corrupted: Tensor
    dla: Tensor | None
    dla_mlp: Tensor | None
    scores: Tensor
    scores_mlp: Tensor | None
    head_scores: dict[str, Tensor]
    pattern_scores: dict[str, Tensor]
    patterns: Tensor
    tokens: tuple[str, ...]
    circuit: TaskCircuit | None
    circuit_error: str | None
    settings: dict[str, Any]
    stages: tuple[StageRecord, ...] = field(default=())
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further node types of the node circuit (``neuron_groups``, ``node_types``): ``{type: {"score": [layer,
    nodes] EAP-IG node scores, "labels": [layer][nodes] names, "hook": layer 0's hook, "patch": how a node is
    patched, "describe": what a label means, "plural": what the answer calls them}}``."""
    single_heads: Any = None
    """The heads patched one at a time against their EAP-IG node scores (``ablate``:
    :class:`~circuitkit.tasks.single_heads.SingleHeads`); None where not asked for."""
    ranking: dict[str, Any] | None = None
    """The scores that ordered the nodes where they are not :attr:`scores` (``node_ranking="joint"``): ``{"heads":
    [layer, head] each head's share along the joint path, "mlps": [layer] or None}`` (written as
    ``heads.joint`` and ``mlps.joint``), from which the order the search added them is read back
    (:func:`circuitkit.tasks.roles.node_order`); None otherwise."""

    @property
    def passes(self) -> float:
        return sum(s.passes for s in self.stages)

    @property
    def verified(self) -> TaskCircuit | None:
        """The found circuit (:attr:`circuit`) under the name the induction scan gives its own
        (:attr:`circuitkit.Scan.verified`): in either scan a :class:`~circuitkit.circuits.record.CircuitRecord`, or
        None where no circuit was found."""
        return self.circuit

    @property
    def agreement(self) -> Any:
        """How well the EAP-IG node scores predicted each head patched alone
        (:class:`~circuitkit.detect.effects.Agreement`, as the induction scan's :attr:`circuitkit.Scan.agreement`);
        None where ``ablate`` was ``"none"``."""
        return None if self.single_heads is None else self.single_heads.agreement

    @property
    def verified_error(self) -> str | None:
        """Why there is no circuit (:attr:`circuit_error`), under the induction scan's name
        (:attr:`circuitkit.Scan.verified_error`); None where one was found."""
        return self.circuit_error

    @property
    def random_baseline(self) -> Any:
        """The circuit's :class:`~circuitkit.circuits.baseline.RandomBaseline`: random head sets of the node
        circuit's size (``random_sets``; None where not asked for or there is no circuit)."""
        return None if self.circuit is None else self.circuit.random_baseline

    @property
    def stability(self) -> Any:
        """The circuit's :class:`~circuitkit.circuits.stability.Stability`: the node search rerun on resampled pairs
        (``stability``; None where not asked for or there is no circuit)."""
        return None if self.circuit is None else self.circuit.stability

    def to_json(self) -> dict[str, Any]:
        """What ``scores.json`` holds: every figure, exactly (:mod:`circuitkit.tasks.record`), so :meth:`load`
        rebuilds this scan."""
        from circuitkit.tasks.record import circuit_extra, dtype_name, pairs_json, task_units
        from circuitkit.tasks.record import nested as n

        return {
            "format": f"circuitkit-task-scan/{TASK_FORMAT}",
            "units": task_units(self),
            "dtype": dtype_name(self.scores.dtype),
            "model": self.model.as_dict(),
            "task": {**self.task.to_json(), "clean": _num(self.clean.mean()), "corrupted": _num(self.corrupted.mean()),
                     "tokens": list(self.tokens),
                     "units": metric_units(self.task.metric),
                     "attention_scores": [list(s) for s in self.task.attention_scores],
                     **({"ci": {k: [_num(lo), _num(hi)] for k, (lo, hi) in self.intervals.items()}}
                        if self.intervals else {})},
            "settings": self.settings,
            "heads": {"dla": n(self.dla), "score": n(self.scores), **{k: n(v) for k, v in self.head_scores.items()},
                      **{k: n(v) for k, v in self.pattern_scores.items() if k not in self.head_scores},
                      **({"joint": n(self.ranking["heads"])} if self.ranking is not None else {}),
                      **({"exact": n(self.single_heads.exact)} if self.single_heads is not None else {})},
            "mlps": {"dla": n(self.dla_mlp), "score": n(self.scores_mlp),
                     **({"joint": n(self.ranking["mlps"])} if self.ranking is not None else {})},
            "pairs": pairs_json(self),
            "patterns": n(self.patterns),
            "pattern_scores": [k for k in self.pattern_scores if k not in self.head_scores],
            **({"nodes": {name: {**{k: v for k, v in kind.items() if k != "score"}, "score": n(kind["score"])}
                              for name, kind in self.nodes.items()}} if self.nodes else {}),
            "circuit": None if self.circuit is None else {**self.circuit.to_json(), **circuit_extra(self.circuit),
                                                          "explanations": member_explanations(self)},
            "circuit_error": self.circuit_error,
            "roles": _roles_json(self),
            "stages": [{"name": s.name, "passes": s.passes, "seconds": s.seconds} for s in self.stages],
            "random_baseline": None if self.random_baseline is None else self.random_baseline.to_json(),
            "stability": None if self.stability is None else self.stability.to_json(),
            **({"single_heads": self.single_heads.to_json()} if self.single_heads is not None else {}),
        }

    def answer(self) -> str:
        """The answer in a few lines of plain text (the terminal's and the report's), its legend last."""
        legend = self.legend()
        return "\n".join(self._lines() + ([legend] if legend else []))

    def searched(self, key: str = "search") -> str | None:
        """The search beyond ranking that chose the node circuit (``key`` ``"search"``) or the edge circuit
        (``"edge_search"``), by name, from the settings (files written before the circuit's search record say it
        there too); None for the ranked one."""
        key = validate.option("TaskScan.searched: key", key, ("search", "edge_search"))
        name = (self.settings.get(key) or {}).get("name", "ranked")
        return None if name == "ranked" else name

    def _searched(self) -> str:
        """How a search beyond ranking chose the node circuit, for its line (nothing for the ranked circuit)."""
        name = self.searched()
        if name is None:
            return ""
        record = None if self.circuit is None else self.circuit.search  # None in a file written before the record
        start = "" if record is None else f" from the ranked {record.start}"
        stopped = None if record is None else record.settings.get("stopped")
        budget = f"; {stop_words('max_passes')}" if stopped == "max_passes" else ""
        return f"; the {name} search{start} in {self.settings['search'].get('passes') or 0:.0f} passes{budget}"

    def _lines(self) -> list[str]:
        t = self.task
        lines = [f"Task {t.name!r}: {t.n_pairs} pairs, metric {metric_label(t.metric)} ({metric_units(t.metric)}): "
                 f"clean {float(self.clean.mean()):+.3f}{_ci(self.intervals.get('clean'))}, corrupted "
                 f"{float(self.corrupted.mean()):+.3f}{_ci(self.intervals.get('corrupted'))}."]
        c = self.circuit
        if c is None:
            lines.append(f"No circuit: {self.circuit_error}")
            return lines + self._estimates_line() + self._tokens_line()
        heads = ", ".join(head_name(h) for h in c.heads[:20]) + (" ..." if len(c.heads) > 20 else "")
        mlps = f" and MLPs {', '.join(str(m) for m in c.mlps)}" if c.mlps else ""
        for name, members in c.nodes.items():
            total = sum(len(row) for row in self.nodes[name]["labels"]) if name in self.nodes else "?"
            listed = ", ".join(members[:20]) + (" ..." if len(members) > 20 else "")
            noun = self.nodes[name].get("plural") if name in self.nodes else None
            mlps += f" and {len(members)} of {total} {noun or name + ' nodes'} ({listed or 'none'})"
        ranked = "; nodes ranked by the joint path" if c.ranked_by == "joint" else ""
        lines.append(f"Node circuit: {len(c.heads)} of {self.model.n_layers * self.model.n_heads} heads{mlps} "
                     f"reach faithfulness {c.faithfulness:.3f}{_ci(c.intervals.get('faithfulness'))} (target "
                     f"{c.target}{self._searched()}{ranked}); patching only them loses {c.necessity:+.3f}"
                     f"{_ci(c.intervals.get('necessity'))}. Heads: {heads}.")
        lines += [f"  {name}: {text}." for name, text in (member_explanations(self) or {}).items()]
        other = c.other_set
        if other is not None:
            searched = "discovery" if other["set"] == "evaluation" else "evaluation"
            if other.get("faithfulness") is None:
                lines.append(f"Held out: on the {other['pairs']} {other['set']} pairs {other.get('note', '')}.")
            else:
                ci = {key: tuple(pair) for key, pair in (other.get("ci") or {}).items()}
                edge = ("" if other.get("edge_faithfulness") is None else
                        f"; the edge circuit {other['edge_faithfulness']:.3f}{_ci(ci.get('edge_faithfulness'))} (on "
                        f"the {searched} pairs {c.edge_faithfulness:.3f})")
                lines.append(f"Held out: on the {other['pairs']} {other['set']} pairs (the target applied to the "
                             f"{searched} pairs) the node circuit's faithfulness is {other['faithfulness']:.3f}"
                             f"{_ci(ci.get('faithfulness'))} (on the {searched} pairs {c.faithfulness:.3f}), "
                             f"necessity {other['necessity']:+.3f}{_ci(ci.get('necessity'))}{edge}.")
        elif self.settings.get("split", {}).get("note"):
            lines.append(f"Pairs: {self.settings['split']['note']}: every figure is on the pairs the circuit was "
                         "found on.")
        lines += self._robustness_lines() + self._estimates_line()
        skipped = self.settings.get("edges_not_measured")
        if skipped:
            lines.append(f"Edge circuit: not measured ({skipped}).")
        if c.edge_faithfulness is not None:
            name, record = self.searched("edge_search"), c.edge_search  # record: None in older files
            found = self.settings.get("edge_search") or {}
            how = (f"edges ranked by {c.rank} score" if name is None else
                   f"the {'' if record is None else f'{record.start} '}edges ranked by {c.rank} score, "
                   f"{count_of(found.get('pruned') or 0, 'dangling edge')} pruned, then the {name} search "
                   f"in {found.get('passes') or 0:.0f} passes")
            lines.append(f"Edge circuit: {len(c.edges)} of {c.n_edges_total} edges reach faithfulness "
                         f"{c.edge_faithfulness:.3f}{_ci(c.intervals.get('edge_faithfulness'))} ({how}); MIB's CPR "
                         f"{c.cpr:.3f}{_ci(c.intervals.get('cpr'))} (edges ranked by signed score), CMD "
                         f"{c.cmd:.3f}{_ci(c.intervals.get('cmd'))} (by absolute score).")
        for e in c.edge_effects[:5]:
            lines.append(f"  {e.name}: exact effect {e.effect:+.3f}{_ci(e.interval)} (EAP-IG {e.score:+.3f})")
        for score, values in self.head_scores.items():
            from circuitkit.ranking import top_heads

            best = top_heads(values, 3)
            named = ", ".join(f"{head_name(h)} ({v:+.2f}){'' if h in c.heads else ' not in the circuit'}"
                              for h, v in best)
            lines.append(f"Largest {score}: {named}.")
        from circuitkit.tasks.roles import roles_line

        roles = roles_line(self)
        return lines + ([roles] if roles else []) + self._tokens_line()

    def _robustness_lines(self) -> list[str]:
        """The random head sets' and the resampled searches' lines, where measured."""
        out = []
        b = self.random_baseline
        if b is not None:
            kinds = "; ".join(f"{label} {k.mean:.3f}{_ci(k.interval)} (sets from {k.spread[0]:.3f} to "
                              f"{k.spread[1]:.3f})" for label, k in (("uniform", b.uniform),
                                                                     ("with the circuit's heads per layer", b.layered)))
            out.append(f"Random sets: faithfulness of {b.n_sets} random sets of {b.size} heads per kind: {kinds}.")
        st = self.stability
        if st is not None:
            jaccard = "n/a" if st.jaccard is None else f"{st.jaccard:.2f}"
            heads = ", ".join(f"{head_name(h)} {share:.0%}" for h, share in st.ranked()[:8]) or "none"
            out.append(f"Stability: the node search rerun on {st.n_resamples} bootstrap resamples of the pairs, mean "
                       f"pairwise Jaccard {jaccard} (stable from 0.80); heads in the resampled circuits: {heads}.")
        return out

    def _estimates_line(self) -> list[str]:
        """How well the EAP-IG node scores predicted each head patched alone, where measured (``ablate``)."""
        from circuitkit.detect.agreement import MIN_HEADS_TO_JUDGE, judged

        single = self.single_heads
        if single is None:
            return []
        a = single.agreement
        rho = "n/a" if a.spearman is None else f"{a.spearman:.2f}"
        spread = single.agreement_interval
        rho += "" if spread is None else f" [{spread[0]:.2f}, {spread[1]:.2f}]"
        judge = "" if judged(a.n_exact) else f": too few heads to judge (fewer than {MIN_HEADS_TO_JUDGE})"
        miss = ""
        if a.largest_miss is not None:
            head, exact, estimate = a.largest_miss
            ci = single.intervals.get(head_name(head))
            miss = f"; largest miss {head_name(head)}: exact {exact:+.3f}{_ci(ci)}, estimated {estimate:+.3f}"
        return [f"Estimates: EAP-IG node score vs each head patched alone (exact): Spearman {rho} over "
                f"{a.n_exact} heads ({single.selection}){judge}{miss}."]

    def _tokens_line(self) -> list[str]:
        said = self.settings.get("tokenization")
        return [f"Tokens: {said}."] if said else []

    def legend(self) -> str:
        """The abbreviations :meth:`answer` uses, explained (those that appear in it)."""
        import re

        text = "\n".join(self._lines())
        found = [meaning(self) if callable(meaning) else meaning for pattern, meaning in LEGEND
                 if re.search(pattern, text)]
        found += [kind["describe"] for kind in self.nodes.values() if kind.get("describe")
                  and any(label in text for row in kind["labels"] for label in row)]
        return "Legend: " + "; ".join(found) + "." if found else ""

    def save(self, out_dir: str | os.PathLike, *, png: bool = False) -> Any:
        """Write ``out_dir/scores.json`` and ``out_dir/report.html`` together (atomically); with ``png``, every
        section of the page as ``out_dir/png/<section>.png`` and the head panel of the first circuit head as
        ``head-<layer.head>.png`` (needs headless Chromium: :func:`circuitkit.report.export_pngs`, as the induction
        scan's :meth:`circuitkit.Scan.save`)."""
        from circuitkit.report.saving import REPORT_NAME, SCORES_NAME, prepare_directory, write_together
        from circuitkit.scan_record import SavedReport
        from circuitkit.tasks.report import task_report

        png = validate.boolean("TaskScan.save: png", png)
        out = prepare_directory(out_dir, kind="scan")  # a scan's pair of files: never beside a track's
        scores = json.dumps(self.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"
        write_together(out, {REPORT_NAME: task_report(self).encode("utf-8"), SCORES_NAME: scores.encode("utf-8")})
        pngs: tuple[Path, ...] = ()
        if png:
            from circuitkit.report.png import export_pngs

            pngs = tuple(export_pngs(out / REPORT_NAME, out / "png"))
        return SavedReport(report=out / REPORT_NAME, scores=out / SCORES_NAME, pngs=pngs)

    def __repr__(self) -> str:
        return f"TaskScan({self.task!r}, {self.model.name!r})\n{self.answer()}"

    @classmethod
    def load(cls, path: str | os.PathLike) -> TaskScan:
        """The task scan :meth:`save` wrote into ``path`` (the directory, or its ``scores.json``), read back equal in
        every figure (:mod:`circuitkit.tasks.reload`); ``circuitkit.Scan.load`` does the same on such a
        directory."""
        from circuitkit.tasks.reload import load_task_scan

        return load_task_scan(path, cls)

    def table(self, sort: str | None = None) -> list[dict[str, Any]]:
        """Every head as a dict: ``head``, ``layer``, ``index``, ``score`` (EAP-IG), ``dla``, the task's head scores,
        the pattern scores, ``in_circuit``; largest ``|sort|`` first (default: the column that ranked the circuit,
        ``joint`` where the joint path did, else ``score``; :mod:`circuitkit.tasks.table`)."""
        from circuitkit.tasks.table import task_table

        return task_table(self, sort)

    def top(self, score: str | None = None, k: int = 5) -> list[tuple[tuple[int, int], float]]:
        """The ``k`` heads with the largest ``|score|``, largest first, as ``((layer, head), value)``: ``score`` a
        column of :meth:`table` (default: the one that ranked the circuit), heads without a value left out. The
        induction scan's :meth:`circuitkit.Scan.top` answers the same question of its scores."""
        from circuitkit.tasks.table import columns, ranking_column, task_table

        score = ranking_column(self) if score is None else validate.option(
            "TaskScan.top: score", score, [name for name, _ in columns(self)])
        k = validate.positive_int("TaskScan.top: k", k)
        return [((row["layer"], row["index"]), row[score]) for row in task_table(self, score)[:k]
                if row[score] is not None]

    def to_pandas(self, sort: str | None = None) -> Any:
        """:meth:`table` as a ``pandas.DataFrame`` indexed by head (needs pandas; a CircuitkitError without it)."""
        from circuitkit.tasks.table import to_pandas

        return to_pandas(self, sort)

    def _repr_html_(self) -> str:
        from circuitkit.tasks.table import summary_html

        return summary_html(self)


def _joint(scan: Any) -> bool:
    return scan.circuit is not None and scan.circuit.ranked_by == "joint"


LEGEND = (
    (r"Heads: \d+\.\d+|\d+\.\d+->|->\d+\.\d+:", "L.H = head H of layer L (from 0)"),
    (r"\bm\d+\b(?!\.n\d)", "mN = the MLP of layer N"),
    (r"\d+\.g\d+:[kv]", "L.gG:k / L.gG:v = the key / value input of key-value group G of layer L (grouped-query "
                          "attention: the group's query heads share it)"),
    (r":q\b", "L.H:q = head L.H's query input"),
    (r"\d+\.\d+:[kv]\b", "L.H:k / L.H:v = head L.H's own key / value input"),
    (r"->", "A->B = the edge from A's output to B's input"),
    (r"\binput->", "input = the residual stream entering layer 0 (the embeddings)"),
    (r"EAP-IG", lambda scan: "EAP-IG = edge attribution patching with integrated gradients (Hanna et al. 2024), "
                             "the first-order estimate the " + ("edges are ranked by" if _joint(scan) else
                                                                "heads and edges are ranked by")),
    (r"joint path", "joint path = every node's activation moved together from its patched value to its own; a "
                    "node's share of the metric's change along it ranks the nodes (the induction scan's ranking)"),
    (r"\bCPR\b", "CPR = area under the faithfulness curve of the top 0.1% to 100% of the edges by signed score "
                "(MIB's circuit performance ratio; higher is better)"),
    (r"\bCMD\b", "CMD = area between 1 and the curve of the edges by absolute score (MIB's circuit-model "
                "distance; lower is better)"),
    (r"io_attention", "io_attention = attention from the last token to the indirect object minus to the subject"),
    (r"s2_attention", "s2_attention = attention from the last token to the subject's second mention minus to the "
                      "indirect object"),
    (r"\bDLA\b", lambda scan: f"DLA = direct logit attribution, {dla_meaning(scan.task.metric)}"),
    (r"IOI roles", lambda scan: "IOI roles = rules over this scan's figures (circuitkit.tasks.roles): "
                                + rules_said(scan)),
)
"""Abbreviations of a task answer and their meaning, a text or a function of the scan (:meth:`TaskScan.legend` lists
those that appear)."""


def _roles_json(scan: TaskScan) -> dict[str, list[str]] | None:
    from circuitkit.tasks.roles import ioi_roles

    roles = ioi_roles(scan)
    return None if roles is None else {role: [head_name(h) for h in heads] for role, heads in roles.items()}


def _ci(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f" [{pair[0]:+.3f}, {pair[1]:+.3f}]"


def _metric_intervals(clean: Tensor, corrupted: Tensor, n_resamples: int, level: float) -> dict[str, tuple]:
    """The mean metric's intervals over the pairs (none with a single pair: no spread to resample)."""
    from circuitkit.uncertainty import bootstrap_ci

    if clean.shape[0] < 2:
        return {}
    out = {}
    for key, values in (("clean", clean), ("corrupted", corrupted)):
        lo, hi = bootstrap_ci(values, n_resamples, level)
        out[key] = (float(lo), float(hi))
    return out


def _num(value: Any) -> float | None:
    """A figure as written (exactly; None for NaN and infinities)."""
    from circuitkit.tasks.record import exact

    return exact(value)


@keeps_model_state
def scan_task(model: Any, task: Task, *, target: float = 0.8, mlps: bool | None = None, mlp_nodes: bool = False,
              rank: str = "abs", node_ranking: str = "joint",
              steps: int = DEFAULT_IG_STEPS, ig_points: str = DEFAULT_IG_POINTS, edges: bool = True,
              device: Any = None, name: str | None = None,
              n_resamples: int = 1000, ci_level: float = 0.95, prepend_bos: bool | None = None,
              metric: Any = None, holdout: float = DEFAULT_HOLDOUT, split_seed: int = 0,
              target_on: str = "discovery", progress: Any = None, quick: bool = False, random_sets: int = 0,
              stability: int = 0, neuron_groups: int | None = None, node_types: tuple = (), search: str = "ranked",
              search_options: dict[str, Any] | None = None, kv_edges: str = DEFAULT_KV_EDGES,
              edge_search: str = "ranked", edge_search_options: dict[str, Any] | None = None,
              ablate: str = DEFAULT_ABLATE, ablate_top: int | None = None) -> TaskScan:
    """Find and measure ``task``'s circuit in ``model`` (module docstring).

    Args:
        target: the faithfulness the node and edge circuits must reach, in (0, 1].
        mlps: MLPs are nodes of the edge graph, sending and receiving edges (default: where the model has MLPs).
        mlp_nodes: MLPs are nodes of the node circuit too, patched like heads (default False: every MLP stays
            clean, recomputed from its input, and the node circuit is a set of heads).
        rank: order nodes and edges by ``"abs"`` (default, as EAP-IG's ``apply_topn``: an edge that works strongly
            against the behaviour is still part of the mechanism) or ``"signed"`` EAP-IG score.
        node_ranking: what orders the nodes for the node circuit: ``"joint"`` (default; stage ``joint``: each node's
            share of the metric's change along the joint path from every node patched to none, every node's
            activation moved together from its patched value to its own, so that nodes that matter only together
            are credited together; the induction scan's ranking, 6 passes) or ``"eap-ig"`` (their EAP-IG node
            scores, on the path from the corrupted input to the clean one); ``rank`` says signed or absolute
            either way. The circuit records it as ``circuit.ranked_by``; edges are ranked by EAP-IG either way.
        steps: EAP-IG interpolation points.
        ig_points: where on the path from the corrupted to the clean input they lie: ``"left"`` (default:
            ``alpha = 0, 1/steps, .., (steps-1)/steps``, as EAP-IG's own code, so scores and circuits compare one
            to one with EAP-IG's and MIB's) or ``"right"`` (``alpha = 1/steps, .., 1``: ends at the clean run;
            ``steps=1`` is plain attribution patching).
        edges: measure the edge circuit too (``False``: nodes only).
        kv_edges: on a grouped-query model, how the edge graph draws the key and value inputs: ``"grouped"``
            (default: one key and one value input per key/value head, read by every query head of its group,
            ``L.gG:k``) or ``"per-query-head"`` (each query head its own, ``L.H:k``, as EAP-IG's and MIB's graph:
            a circuit can keep one head's key edge without the rest of its group, and its edge counts compare one
            to one with theirs). Per query head, an edge-patching pass runs up to one copy of the pairs per query
            head of a group (heads of a group keeping the same edges share one), each head's keys and values
            patched exactly while the others of its group keep theirs, so the edge stage costs up to that many
            times more, for more, finer edges to rank; grouped is the default for that cost. EAP-IG costs the same
            passes on either graph (a group's gradient is split by query head within its pass). On a
            model where every query head has its own key/value head the two graphs are one.
        prepend_bos: how text prompts become tokens: ``None`` (default: the model's tokenizer's own rule,
            ``add_special_tokens=True``), ``True`` (its BOS, then the text's tokens), ``False`` (the text's tokens
            alone); token-id prompts run as given. The rule that ran is in ``settings["prepend_bos"]`` and
            ``settings["tokenization"]``.
        metric: the metric to read instead of the task's own: a name in :data:`~circuitkit.tasks.METRICS` (or
            an alias) or a function ``metric(logits [pair, vocab], batch) -> [pair]``
            (:class:`~circuitkit.graph.metrics.UserMetric`: checked for shape, finiteness and gradient).
        holdout: share of the pairs held out for evaluation (default 0.5; 0: no split; tasks of fewer than
            :data:`MIN_SPLIT_PAIRS` pairs are not split), drawn with ``split_seed``. Attribution and the circuit
            search use the discovery pairs; the circuit's faithfulness (its whole curve), necessity and edge
            faithfulness are also measured on the evaluation pairs and reported beside them.
        target_on: the set whose faithfulness ``target`` applies to: ``"discovery"`` (default: the evaluation
            pairs then take no part in any choice, so their figure is an honest held-out estimate) or
            ``"evaluation"`` (the circuit is sized on the evaluation pairs, e.g. to guarantee the held-out figure;
            it is then no longer untouched, and the discovery figure is reported beside it).
        progress: how the stages' progress is shown (:class:`~circuitkit.progress.Progress`, planned in passes
            before the first pass: :mod:`circuitkit.tasks.stages`): ``"bar"``, ``"lines"`` (one line per stage
            on stderr, the plan first), ``True`` (a bar on a terminal, else lines), ``None`` / ``False`` / ``"off"``
            (default: nothing); or a function ``progress(stage, passes)`` called as each stage ends.
        quick: the node circuit only, fast: no edge circuit (as ``edges=False``), EAP-IG with one point (plain
            attribution patching at the clean run: 3 passes instead of ``3 * steps``; ``steps`` is then not
            taken), and on the held-out pairs the circuit's own faithfulness and necessity, not the whole curve.
        random_sets: measure that many random head sets of the node circuit's size per kind (uniform, and with the
            circuit's per-layer counts) beside it (:mod:`circuitkit.tasks.robustness`; ``2 * random_sets``
            passes of the pairs the search ran on; 0, the default: none, else at least 2).
        stability: rerun the node search on that many bootstrap resamples of the pairs it ran on: each head's
            inclusion frequency and the circuits' mean pairwise Jaccard (each rerun about the clean, corrupted,
            EAP-IG and node-search passes again; 0, the default: none, else at least 2).
        search: how the node circuit is found (:mod:`circuitkit.circuits.search`): ``"ranked"`` (default: the
            smallest top-``n`` set in the ``node_ranking`` order), ``"refined"`` (that set, then exact drops and swaps
            while the target holds) or ``"masks"`` (learned continuous node masks, then the smallest top-``n`` of their
            order); ``search_options``: that search's options. ``settings["search"]`` says which ran and its passes;
            the circuit's ``search`` (``circuit.search`` in ``scores.json``, as the induction circuit's) its record:
            the ranked size it started from, its trace and why it stopped.
        edge_search: how the edge circuit is found: ``"ranked"`` (default: the smallest top-``k`` edge set by
            EAP-IG score) or ``"refined"`` (stage ``edge-search``: from that set, its dangling edges pruned, then
            the refined search's block rounds and drops while the target holds,
            :func:`~circuitkit.tasks.search.search_edge_circuit`). The searched edges become the circuit's edges
            and edge faithfulness, and the held-out stage measures them; the edge curve, CPR/CMD and the edge
            effects stay the ranking's (the effects of the strongest ranked edges the search kept). Its cost is
            bounded by a pass budget, ``max_passes`` (default :data:`~circuitkit.tasks.search.
            DEFAULT_EDGE_SEARCH_PASSES`, 30: about the edge stage's own cost; the search stops before a round that
            would pass it, its circuit then not known to be minimal), one more set for the pruned circuit, and its
            swaps where it reaches single drops. ``edge_search_options``: the refined search's options
            (``max_passes``, ``swaps``, ``singles``, ``max_rounds``; ``max_passes=None``: no budget).
            ``settings["edge_search"]`` says which ran, its options, passes and the dangling edges pruned, the
            circuit's ``edge_search`` its record (``circuit.edge_search``). Not with
            ``edges=False`` or ``quick``.
        n_resamples, ci_level: the percentile bootstrap over the pairs behind the intervals of the mean metric, the
            node circuit's faithfulness and its necessity (from each pair's values in the passes already run).
        neuron_groups: MLP neurons as nodes of the node circuit (MIB's neuron level): each MLP's hidden units in
            this many contiguous groups, ``m{l}.n{g}``, ranked with the heads (``node_ranking``) and patched
            exactly (a group's activations replaced); default None: no neuron nodes. Not with ``mlp_nodes``.
        node_types: further :class:`~circuitkit.graph.nodes.NodeType` records whose nodes join the node circuit
            (:mod:`circuitkit.graph.nodes`).
        ablate: how far to trust the EAP-IG node scores (stage ``ablate``; :mod:`circuitkit.tasks.single_heads`):
            ``"none"`` (default), ``"top"`` (the ``ablate_top`` heads with the largest ``|score|``, None:
            :data:`~circuitkit.detect.agreement.DEFAULT_ABLATE_TOP`; given only with ``"top"``) or ``"all"``
            (every head), each patched
            alone exactly, its metric lost against its score: the Spearman correlation over them and the largest
            miss, as the induction scan's ``ablate`` (``TaskScan.single_heads``, ``TaskScan.agreement``, the
            table's ``exact`` column). About half a pass of the pairs a head.
    """
    from circuitkit.models.adapters import adapt

    task, o = _checked(task, metric=metric, target=target, holdout=holdout, split_seed=split_seed,
                       target_on=target_on, search=search, search_options=search_options, edge_search=edge_search,
                       edge_search_options=edge_search_options, rank=rank, node_ranking=node_ranking, steps=steps,
                       ig_points=ig_points, edges=edges, kv_edges=kv_edges, quick=quick, random_sets=random_sets,
                       stability=stability, n_resamples=n_resamples, ci_level=ci_level, mlp_nodes=mlp_nodes, name=name,
                       progress=progress, neuron_groups=neuron_groups, node_types=node_types, ablate=ablate,
                       ablate_top=ablate_top)
    adapter = adapt(model, validate.device("scan_task: device", device))
    mlps = (not adapter.attn_only) if mlps is None else validate.boolean("scan_task: mlps", mlps)
    check_hooks(adapter, mlps)
    batch = task.tokenize(adapter, check_prepend_bos("scan_task", prepend_bos))
    state, split = _prepared(adapter, task, batch, mlps, o, progress if callable(progress) else None)
    plan = _plan(state, o)
    bar = task_progress(task.name, o.mode, task_plan(plan))
    try:
        run_planned(TASK_STAGES, state, plan, bar)
    finally:
        bar.close()
    return _task_scan(state, task, adapter, batch, split, mlps, plan.edges, bar)


def _checked(task: Any, *, metric: Any, target: Any, holdout: Any, split_seed: Any, target_on: Any, search: Any,
             search_options: Any, edge_search: Any, edge_search_options: Any, rank: Any, node_ranking: Any,
             steps: Any, ig_points: Any,
             edges: Any, kv_edges: Any, quick: Any, random_sets: Any, stability: Any, n_resamples: Any,
             ci_level: Any, mlp_nodes: Any, name: Any, progress: Any, neuron_groups: Any,
             node_types: Any, ablate: Any = DEFAULT_ABLATE, ablate_top: Any = None,
             ) -> tuple[Task, TaskOptions]:
    """``task`` (with ``metric`` in place of its own where given) and :func:`scan_task`'s options, each checked
    before the model is read (a ``CircuitkitError`` naming the first bad one)."""
    from circuitkit.circuits.faithfulness import check_repeats, check_target
    from circuitkit.graph.nodes import neuron_groups as neuron_type
    from circuitkit.progress import progress_mode
    from circuitkit.uncertainty import check_settings

    if not isinstance(task, Task):
        raise validate.fail("scan_task: task", task, "a circuitkit.tasks.Task (load_task, Task.from_pairs, ioi, ...)")
    if metric is not None:
        task = replace(task, metric=metric)  # validated as a Task's own metric is
    target = check_target("scan_task: target", target)
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 <= holdout < 1:
        raise validate.fail("scan_task: holdout", holdout, "a share of the pairs in [0, 1) (0: no split)")
    split_seed = validate.seed("scan_task: split_seed", split_seed)
    target_on = validate.option("scan_task: target_on", target_on, TARGETS_ON)
    node_search = validate.option("scan_task: search", search, SEARCH_NAMES)
    if node_search != "ranked" and (neuron_groups is not None or node_types):
        raise validate.fail("scan_task: search", search, "'ranked' beside neuron_groups or node_types (the other "
                            "searches choose among heads and MLPs)")
    search_options = check_search_options("scan_task: search_options", node_search, search_options)
    edge_search = validate.option("scan_task: edge_search", edge_search, EDGE_SEARCH_NAMES)
    if edge_search_options is not None and not isinstance(edge_search_options, dict):
        raise validate.fail("scan_task: edge_search_options", edge_search_options, "a dict of the edge search's "
                            "options or None")
    if edge_search == "ranked" and edge_search_options:
        raise validate.fail("scan_task: edge_search_options", edge_search_options, "None beside "
                            "edge_search='ranked' (the ranked edge circuit takes no options)")
    edge_options = _edge_options(edge_search, edge_search_options)
    rank = validate.option("scan_task: rank", rank, RANKS)
    node_ranking = validate.option("scan_task: node_ranking", node_ranking, NODE_RANKINGS)
    steps = validate.integer("scan_task: steps", steps, minimum=1, maximum=64)
    ig_points = validate.option("scan_task: ig_points", ig_points, IG_POINTS)
    edges = validate.boolean("scan_task: edges", edges)
    kv_edges = validate.option("scan_task: kv_edges", kv_edges, KV_EDGES)
    quick = validate.boolean("scan_task: quick", quick)
    if quick and steps != DEFAULT_IG_STEPS:
        raise validate.fail("scan_task: steps", steps, f"left at {DEFAULT_IG_STEPS} with quick=True (a quick scan "
                            "runs EAP-IG with one point)")
    if edge_search != "ranked" and (quick or not edges):
        raise validate.fail("scan_task: edge_search", edge_search, "'ranked' beside edges=False or quick=True (no "
                            "edge circuit to search)")
    if quick:
        steps, edges = 1, False
    random_sets = check_repeats("scan_task: random_sets", random_sets)
    stability = check_repeats("scan_task: stability", stability)
    n_resamples, ci_level, _ = check_settings("scan_task", n_resamples, ci_level, 0, "ci_level")
    mlp_nodes = validate.boolean("scan_task: mlp_nodes", mlp_nodes)
    ablate, ablate_top = check_ablate(ablate, ablate_top, "scan_task")
    if name is not None and (not isinstance(name, str) or not name.strip() or "\n" in name or len(name) > 200):
        raise validate.fail("scan_task: name", name, "a one-line model name of at most 200 characters")
    if not callable(progress) and progress is not None and not isinstance(progress, (bool, str)):
        raise validate.fail("scan_task: progress", progress, "'bar', 'lines', 'off', True, False, None or a "
                            "function progress(stage, passes)")
    mode = "off" if progress is None or callable(progress) else progress_mode(progress)
    extra = tuple(validate.bounded_list("scan_task: node_types", node_types, 16, "a list of NodeType records"))
    if neuron_groups is not None:
        if mlp_nodes:
            raise validate.fail("scan_task: neuron_groups", neuron_groups, "None beside mlp_nodes=True (an MLP is a "
                                "node or its neuron groups are, not both)")
        extra = (neuron_type(neuron_groups), *extra)
    return task, TaskOptions(target, rank, steps, ig_points, quick, random_sets, stability, n_resamples, ci_level,
                             mlp_nodes, node_search, search_options, edge_search, edge_options, holdout=holdout,
                             split_seed=split_seed, target_on=target_on, edges=edges, kv_edges=kv_edges,
                             node_types=extra, neuron_groups=neuron_groups, name=name, mode=mode,
                             node_ranking=node_ranking, ablate=ablate, ablate_top=ablate_top)


def _prepared(adapter: Any, task: Task, batch: Any, mlps: bool, o: TaskOptions,
              told: Any) -> tuple[TaskScanState, tuple[Tensor, Tensor | None]]:
    """The scan's state before its first pass: the pairs split into discovery and evaluation (``split``: their
    indices, the second None where not split), their memory checked against the device, a runner for each set
    (the set the target applies to searched, the other measured)."""
    discovery_index, evaluation_index = split_pairs(task.n_pairs, o.holdout, o.split_seed)
    split = evaluation_index is not None
    # the joint path stacks two copies of the pairs with gradients, as EAP-IG does its points (with fewer leaves)
    steps = max(o.steps, 2) if o.node_ranking == "joint" else o.steps
    reads = read_mask(task.metric, batch)  # positions read besides the last tokens: their logits are held in float32
    memory = check_task_memory(adapter, batch.n_pairs, batch.pos, steps=steps, mlps=mlps,
                               edges=o.edges and bool(adapter.additive_heads),
                               evaluation_pairs=0 if evaluation_index is None else len(evaluation_index),
                               logit_positions=logit_positions(adapter, batch.last, batch.pos, reads),
                               scored_metric=reads is not None, kv_edges=o.kv_edges,
                               node_widths=node_widths(adapter, o.node_types))
    found = batch.subset(discovery_index) if split else batch
    runner = TaskRunner(adapter, found, task.metric, mlps=mlps, ablation=task.ablation, node_types=o.node_types,
                        kv_edges=o.kv_edges, budget=memory.budget)
    runner.pattern_masks = registered_pattern_masks(found)
    held = TaskRunner(runner.session, batch.subset(evaluation_index), task.metric, mlps=mlps,  # one session
                      ablation=task.ablation, node_types=o.node_types, kv_edges=o.kv_edges,
                      budget=memory.budget) if split else None
    if held is not None:
        held.direct = False  # its clean run gives the metric and the senders' outputs; the DLA and patterns are read
        # on the discovery pairs
    # the target applies to the discovery pairs (default) or the evaluation pairs: the search runs on that set
    search, other = (held, runner) if split and o.target_on == "evaluation" else (runner, held)
    if o.stability and search.batch.n_pairs < 2:
        raise validate.fail("scan_task: stability", o.stability, "0 where the search runs on a single pair (a "
                            "resample of one pair is that pair)")
    return TaskScanState(o, runner, held, search, other, told), (discovery_index, evaluation_index)


def _plan(state: TaskScanState, o: TaskOptions) -> PlanInputs:
    """What the scan knows before its first pass, for its plan of passes (:class:`PlanInputs`); edges only where
    the family defines them (:data:`~circuitkit.graph.runner.EDGES_UNDEFINED`)."""
    runner, spec = state.runner, state.runner.spec
    graph = runner.graph
    mlp_nodes_on = o.mlp_nodes and graph.mlps
    return PlanInputs(nodes=spec.n_layers * (spec.n_heads + (1 if mlp_nodes_on else 0)
                                             + sum(kind.count(spec) for kind in o.node_types)),
                      edges_total=graph.n_edges, pairs=state.search.batch.n_pairs,
                      held=0 if state.other is None else state.other.batch.n_pairs, direct=runner.edges_defined,
                      steps=o.steps, edges=o.edges and runner.edges_defined, quick=o.quick,
                      random_sets=o.random_sets, stability=o.stability, search=o.node_search,
                      search_passes=search_estimate(o.node_search, o.search_options), kv_copies=graph.kv_copies,
                      edge_search=o.edge_search, edge_search_passes=_budget(o.edge_options.get("max_passes")),
                      folded=runner.folds_corrupted(o.steps, o.ig_points), node_ranking=o.node_ranking,
                      single_heads=planned_heads(o.ablate, o.ablate_top, spec.n_layers * spec.n_heads))


def _task_scan(state: TaskScanState, task: Task, adapter: Any, batch: Any, split: tuple[Tensor, Tensor | None],
               mlps: bool, edges: bool, bar: Any) -> TaskScan:
    """The :class:`TaskScan` of the stages' state: the figures per head and MLP, the circuit, the settings as run
    (with the plan as made before the first pass), every pair's metric in the task's order."""
    from circuitkit.scan_record import summarise_model

    o, runner, held = state.options, state.runner, state.held
    discovery_index, evaluation_index = split
    found = runner.batch
    circuit = None if state.node is None else _circuit(state, task)
    clean, corrupted, node_scores, typed = state.clean, state.corrupted, state.node_scores, state.typed
    stages = list(bar.ran)
    graph, spec = runner.graph, adapter.spec
    L = spec.n_layers
    head_index = graph.head_senders
    mlp_index = torch.tensor([graph.sender_index(layer, None) for layer in range(L)], device="cpu") if mlps else None
    dla_all = clean["dla"]
    marks = [task.marks[i] for i in discovery_index.tolist()] if task.marks else []
    head_scores = {name: _attention_score(clean["last_attention"], marks, found, to, minus)
                   for name, to, minus in task.attention_scores}
    edges_skipped = None if not o.edges or runner.edges_defined else f"{spec.family}: {EDGES_UNDEFINED}"
    split_record = {"holdout": o.holdout, "seed": o.split_seed,
                    "target_on": o.target_on if held is not None else "all pairs", "discovery_pairs": found.n_pairs,
                    "evaluation_pairs": 0 if held is None else held.batch.n_pairs,
                    "note": None if held is not None else f"not split: fewer than {MIN_SPLIT_PAIRS} pairs or holdout 0"}
    settings = {"target": o.target, "rank": o.rank, "ig_steps": o.steps, "ig_points": o.ig_points,
                "mlps": mlps, "mlp_nodes": o.mlp_nodes, "edges": edges, "kv_edges": o.kv_edges,
                "edges_not_measured": edges_skipped if edges_skipped else None if edges else
                "quick=True" if o.quick else "edges=False", "quick": o.quick, "random_sets": o.random_sets,
                "stability": o.stability,
                "plan": {name: round(passes, 3) for name, passes in bar.planned.items()},
                "ablation": task.ablation, "device": str(spec.device), "n_resamples": o.n_resamples,
                "ci_level": o.ci_level, "prepend_bos": batch.rule, "tokenization": _tokenization(adapter, task, batch),
                "split": split_record, "node_ranking": o.node_ranking}
    if o.ablate != "none":  # only where asked, as the node types
        settings["ablate"] = o.ablate
        settings["ablate_top"] = o.ablate_top
    if o.node_types:  # only where asked: the settings of a scan without further node types are as they were
        settings["neuron_groups"] = o.neuron_groups
        settings["node_types"] = [kind.name for kind in o.node_types]
    search_stage = "search" if o.node_search != "ranked" else "nodes"  # which search ran, and its passes (where it
    # started and why it stopped: the circuit's search record)
    settings["search"] = {"name": o.node_search, "options": dict(o.search_options or {}),
                          "passes": next((s.passes for s in stages if s.name == search_stage), None)}
    edge_stage = "edge-search" if o.edge_search != "ranked" else "edges"
    settings["edge_search"] = {"name": o.edge_search, "options": o.edge_options if o.edge_search != "ranked" else {},
                               "passes": next((s.passes for s in stages if s.name == edge_stage), None),
                               "pruned": None if state.edge_result is None else state.edge_result.settings["pruned"]}
    clean_all, corrupted_all = clean["metric"], corrupted["metric"]
    if held is not None:  # every pair's metric in the task's order
        clean_all = torch.empty(task.n_pairs, device="cpu")  # as each runner's metric
        corrupted_all = torch.empty(task.n_pairs, device="cpu")
        clean_all[discovery_index], corrupted_all[discovery_index] = clean["metric"], corrupted["metric"]
        clean_all[evaluation_index] = held.clean["metric"]
        corrupted_all[evaluation_index] = held.corrupted["metric"]
    return TaskScan(
        model=summarise_model(adapter, o.name),
        task=task,
        clean=clean_all,
        corrupted=corrupted_all,
        dla=None if dla_all is None else dla_all[head_index],
        dla_mlp=None if mlp_index is None or dla_all is None else dla_all[mlp_index],
        scores=node_scores[head_index],
        scores_mlp=None if mlp_index is None else node_scores[mlp_index],
        head_scores=head_scores,
        pattern_scores=dict(runner.pattern_scores),
        patterns=clean["first_patterns"],
        tokens=_token_strings(adapter, found.clean[0, : int(found.last[0]) + 1]),
        circuit=circuit,
        circuit_error=state.error,
        settings=settings,
        intervals=_metric_intervals(clean_all, corrupted_all, o.n_resamples, o.ci_level),
        stages=tuple(stages),
        single_heads=state.single,
        ranking=None if state.ranking is None else {
            "heads": state.ranking[head_index],
            "mlps": None if mlp_index is None or not o.mlp_nodes else state.ranking[mlp_index]},
        nodes={kind.name: {"score": typed[kind.name], "labels": [[kind.label(layer, i) for i in range(
            kind.count(spec))] for layer in range(L)], "hook": kind.hook(0), "patch": kind.patch,
            "describe": kind.describe, "plural": kind.plural or f"{kind.name} nodes"} for kind in o.node_types},
    )

def _circuit(state: TaskScanState, task: Task) -> TaskCircuit:
    """The :class:`TaskCircuit` the stages measured: the node circuit, the edge circuit (where measured) and the
    circuit on the other pairs, with the intervals of their figures over the pairs the search ran on."""
    node, search, o = state.node, state.search, state.options
    names, edge_faith, edge_curve, cpr, cmd, effects, n_edges, areas = state.edge_part
    clean, corrupted = search.clean["metric"], search.corrupted["metric"]
    intervals = circuit_intervals(node.pairs, clean, o.n_resamples, o.ci_level)
    if edge_faith is not None and state.edge_pairs:
        intervals |= edge_intervals(state.edge_pairs, clean, corrupted, o.n_resamples, o.ci_level,
                                    circuit=o.edge_search == "ranked")
        effects = effect_intervals(effects, o.n_resamples, o.ci_level)
    return TaskCircuit(heads=node.heads, mlps=node.mlps, faithfulness=node.faithfulness, necessity=node.necessity,
                       target=o.target, curve=node.curve, n_nodes_total=node.n_nodes, edges=names,
                       edge_faithfulness=edge_faith, edge_curve=edge_curve, n_edges_total=n_edges, cpr=cpr, cmd=cmd,
                       edge_effects=effects, rank=o.rank, clean=float(clean.mean()),
                       corrupted=float(corrupted.mean()), node_corrupted=node.all_patched, intervals=intervals,
                       other_set=state.other_set, nodes=node.nodes, edge_areas=areas, ablation=task.ablation,
                       search=state.node_result, edge_search=state.edge_result, ranked_by=o.node_ranking,
                       random_baseline=state.baseline, stability=state.stable)


def _edge_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The edge search's options with the default pass budget, checked before the first pass
    (:func:`~circuitkit.circuits.search.check_search_options`: names the search takes, not its start or progress,
    which the scan gives; each value as the search checks it, a budget None or at least 0 passes)."""
    if name == "ranked":
        return {}
    return {"max_passes": DEFAULT_EDGE_SEARCH_PASSES,
            **(check_search_options("scan_task: edge_search_options", name, options) or {})}


def _budget(max_passes: Any) -> float:
    """The edge search's planned passes: its budget (with none, the default's figure; the bar revises it)."""
    return DEFAULT_EDGE_SEARCH_PASSES if max_passes is None else float(max_passes)


def split_pairs(n: int, holdout: float, seed: int) -> tuple[Tensor, Tensor | None]:
    """``(discovery, evaluation)`` pair indices: a seeded random ``holdout`` share of the ``n`` pairs held out for
    evaluation (rounded, at least one pair each side), the rest for discovery; no split (``None``) for ``holdout``
    0 or fewer than :data:`MIN_SPLIT_PAIRS` pairs."""
    if holdout == 0 or n < MIN_SPLIT_PAIRS:
        return torch.arange(n, device="cpu"), None
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed), device="cpu")
    k = min(n - 1, max(1, round(holdout * n)))
    return order[k:].sort().values, order[:k].sort().values


def registered_pattern_masks(batch: Any) -> dict[str, tuple[Tensor, float]]:
    """Each registered pattern score's targets on the clean prompts, restricted to real (not padding) queries and
    keys, with the number of query rows that have a target; scores without a target here are left out (a task's
    prompts need not repeat tokens). A score is then ``sum(pattern * targets) / rows`` (the registry's
    definition)."""
    from circuitkit.detect import registry

    real = batch.real.cpu()
    keep = real[:, :, None] & real[:, None, :]
    out: dict[str, tuple[Tensor, float]] = {}
    for definition in registry.registered("pattern"):  # targets, not the fast row readers: padding is masked
        mask = registry.targets_of(definition, batch.clean.cpu()) & keep
        rows = int(mask.any(dim=2).sum())
        if rows:
            out[definition.name] = (mask.float(), float(rows))
    return out


def _attention_score(last_attention: Tensor, marks: list[dict[str, int]], batch: Any, to: str, minus: str) -> Tensor:
    """``[layer, head]``: attention from each prompt's last token to mark ``to`` minus to mark ``minus``, averaged
    over the batch's pairs (``last_attention``: ``[layer, pair, head, pos]``; ``marks``: the batch's pairs' marks,
    counting text tokens, shifted by the special tokens before them, ``batch.prefix``)."""
    n = len(marks)
    rows = torch.arange(n)
    shift = batch.prefix.cpu() if batch.prefix is not None else torch.zeros(n, dtype=torch.long)
    at = torch.tensor([m[to] for m in marks]) + shift
    away = torch.tensor([m[minus] for m in marks]) + shift
    per_pair = last_attention.permute(1, 0, 2, 3)  # [pair, layer, head, pos]
    return (per_pair[rows, :, :, at] - per_pair[rows, :, :, away]).mean(0)


def _tokenization(adapter: Any, task: Task, batch: Any) -> str:
    """The BOS rule that ran, in words, with the special tokens it put before the first text prompt."""
    if not any(isinstance(p.clean, str) for p in task.pairs):
        return "token ids as given (no tokenizer ran)"
    rule = {"auto": "the tokenizer's default (add_special_tokens=True)", "yes": "prepend_bos=True (BOS, then the "
            "text's tokens)", "no": "prepend_bos=False (the text's tokens alone)"}[batch.rule]
    n = int(batch.prefix[0]) if batch.prefix is not None else 0
    before = _token_strings(adapter, batch.clean[0, :n]) if n else ()
    added = f"{n} special token(s) {list(before)} before the text" if n else "no token before the text"
    return f"{rule}: {added} (first prompt)"


def _token_strings(adapter: Any, tokens: Tensor) -> tuple[str, ...]:
    tokenizer = adapter.tokenizer
    ids = tokens.tolist()
    if tokenizer is None:
        return tuple(str(t) for t in ids)
    return tuple(tokenizer.decode([t]) for t in ids)


__all__ = ["DEFAULT_HOLDOUT", "DEFAULT_IG_STEPS", "MIN_SPLIT_PAIRS", "TaskScan", "scan_task",
           "split_pairs"]
