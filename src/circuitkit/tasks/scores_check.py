"""Every rule a computed task scan satisfies, checked on a parsed task ``scores.json`` before it is rebuilt.

Why: :meth:`TaskScan.load <circuitkit.tasks.TaskScan.load>` reads files that other versions, other people or an
editor wrote; a file no scan could have written must not load, print an answer and be saved again as the report of
a scan that never ran. The rules (``L`` = ``model.n_layers``, ``H`` = ``model.n_heads``, ``T`` = the tokens of the
first clean prompt, ``n`` = the task's pairs), each failure one :class:`~circuitkit.CircuitkitError` line naming the
file and the field:

- **types** as ``tasks/task_scores.schema.json`` says (ints are ints, not bools or ``2.0``; strings are strings);
- **finite**: no number is NaN or infinite, no integer exceeds int64;
- **ranges**: the model's sizes as the induction scan's file (:mod:`circuitkit.report.scores_check`); settings in
  the range :func:`~circuitkit.tasks.scan_task` accepts; pattern scores and attention in [0, 1], the task's own
  attention scores in [-1, 1]; intervals ``lo <= hi``;
- **shapes**: every ``[layer][head]`` grid is ``L x H``, every MLP vector ``L``, ``patterns`` ``L x H x T x T``, the
  per-pair metric and the pairs ``n``;
- **names**: every head ``"layer.head"`` and MLP index exists in the model; every edge runs from an earlier node
  to a later one between nodes of the model, into a receiver of the scan's graph (key/value receivers per query
  head, ``L.H:k``, where ``settings.kv_edges`` is ``"per-query-head"`` or every query head has its own key/value
  head; else per key/value group, ``L.gG:k``).

What is derived from other fields (the means, ``units``, ``roles``, the examples, each edge-curve point's
``fraction``) is checked after the build, by writing the loaded scan again and comparing
(:func:`circuitkit.report.scores_check.first_difference`).
"""

from __future__ import annotations

import re
from typing import Any

from circuitkit import validate
from circuitkit.report.scores_check import SCORE_TOLERANCE, ScoresCheck

REQUIRED = ("format", "units", "dtype", "model", "task", "settings", "heads", "mlps", "pairs", "patterns",
            "pattern_scores", "circuit", "circuit_error", "roles", "stages")
OPTIONAL = ("random_baseline", "stability", "nodes", "single_heads")
"""Top-level keys a task scan writes where asked for (random sets, stability, further node types, the heads patched
one at a time)."""
TASK_REQUIRED = ("name", "metric", "pairs", "ablation", "description", "examples", "clean", "corrupted", "tokens",
                 "units", "attention_scores")
CIRCUIT_REQUIRED = ("heads", "mlps", "faithfulness", "necessity", "target", "ablation", "curve", "nodes_total",
                    "edges", "edge_faithfulness", "edge_curve", "edges_total", "cpr", "cmd", "edge_effects", "rank",
                    "metric_all_nodes_patched", "other_set", "metric_clean", "metric_corrupted")
CUSTOM_METRIC = re.compile(r"^custom:[A-Za-z0-9_.<>]{1,60}$")
"""A researcher's metric as a task names it (:class:`circuitkit.graph.task.UserMetric`'s label)."""
SENDER = re.compile(r"^(?:input|m(\d{1,9})|(\d{1,9})\.(\d{1,9}))$")
RECEIVER = re.compile(r"^(?:logits|m(\d{1,9})|(\d{1,9})\.(g?)(\d{1,9}):([qkv]))$")
MAX_STEPS = 64


class TaskScoresCheck(ScoresCheck):
    """The checks of one parsed task ``scores.json`` (``where`` names the file in every error)."""

    unknown_key = "no such key (a task scan's scores.json does not have it)"

    def __init__(self, data: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
        super().__init__(data, where)
        self.extra = extra

    def run(self) -> None:
        from circuitkit.tasks.record import DTYPES

        data = self.obj(self.data, "", REQUIRED, OPTIONAL + self.extra)
        self.plain_numbers(data)
        for key, unit in self.obj(data["units"], "units").items():
            self.text(unit, f"units.{key}")
        self.option(data["dtype"], "dtype", tuple(DTYPES))
        self.model(data["model"])
        n, tokens, head_scores = self.task(data["task"])
        self.settings_of(data["settings"])
        self.pairs(data["pairs"], n)
        self.heads_of(data["heads"], head_scores)
        named = self.array(data["pattern_scores"], "pattern_scores")
        grids = [k for k in data["heads"] if k not in ("dla", "score", "joint", "exact") and k not in head_scores]
        if sorted(map(str, named)) != sorted(grids) or len(set(map(str, named))) != len(named):
            raise self.fail("pattern_scores", named,
                            f"the names of the pattern score grids in heads ({sorted(grids)}), each once")
        self.mlps(data["mlps"], data["settings"])
        self.patterns(data["patterns"], tokens)
        self.node_labels: dict[str, set[str]] = {}
        for name, kind in self.obj(data.get("nodes", {}), "nodes").items():  # further node types (neuron groups..)
            at = f"nodes.{name}"
            kind = self.obj(kind, at, ("score", "labels", "hook", "patch", "describe", "plural"))
            self.text(name, "nodes", non_empty=True)
            for key in ("hook", "patch", "describe", "plural"):
                self.text(kind[key], f"{at}.{key}", non_empty=True)
            rows = self.array(kind["labels"], f"{at}.labels", length=self.n_layers)
            width = None
            for layer, row in enumerate(rows):
                row = self.array(row, f"{at}.labels[{layer}]", length=width, why="as many in every layer")
                width = len(row)
                for i, label in enumerate(row):
                    self.text(label, f"{at}.labels[{layer}][{i}]", non_empty=True)
            if not width:
                raise self.fail(f"{at}.labels", kind["labels"], "at least one node a layer")
            for layer, row in enumerate(self.array(kind["score"], f"{at}.score", length=self.n_layers)):
                for i, cell in enumerate(self.array(row, f"{at}.score[{layer}]", length=width, why="one per node")):
                    self.number(cell, f"{at}.score[{layer}][{i}]")
            labels = {str(label) for row in rows for label in row}
            if len(labels) != self.n_layers * width:
                raise self.fail(f"{at}.labels", validate.given("a repeated label"), "every node's label distinct")
            self.node_labels[name] = labels
        self.ranking(data["heads"], data["mlps"], data["settings"])
        self.circuit(data["circuit"])
        if data.get("random_baseline") is not None:  # opt-in: random node sets of the circuit's head count
            if data["circuit"] is None:
                raise self.fail("random_baseline", data["random_baseline"], "null where there is no circuit")
            self.random_baseline(data["random_baseline"], len(data["circuit"]["heads"]))
        self.stability(data.get("stability"))  # opt-in: the node search rerun on resampled pairs
        self.single_heads(data.get("single_heads"), data["heads"], data["settings"])  # opt-in: ablate
        error = self.text(data["circuit_error"], "circuit_error", nullable=True)
        if data["circuit"] is None and error is None:
            raise self.fail("circuit_error", None, "why there is no circuit (circuit is null)")
        roles = self.obj(data["roles"], "roles", nullable=True) or {}
        for role, heads in roles.items():
            self.heads(heads, f"roles.{role}")
        for i, stage in enumerate(self.array(data["stages"], "stages")):
            at = f"stages[{i}]"
            stage = self.obj(stage, at, ("name", "passes", "seconds"))
            self.text(stage["name"], f"{at}.name", non_empty=True)
            self.number(stage["passes"], f"{at}.passes", 0.0, nullable=False)
            self.number(stage["seconds"], f"{at}.seconds", 0.0, nullable=False)

    def task(self, value: Any) -> tuple[int, int, set[str]]:
        from circuitkit.graph.task import ABLATIONS, MAX_PAIRS, METRIC_NAMES

        task = self.obj(value, "task", TASK_REQUIRED, ("ci",))
        self.text(task["name"], "task.name", non_empty=True)
        metric = task["metric"]
        if not (isinstance(metric, str) and (metric in METRIC_NAMES or CUSTOM_METRIC.fullmatch(metric))):
            raise self.fail("task.metric", metric, f"one of {list(METRIC_NAMES)} or 'custom:NAME'")
        n = self.integer(task["pairs"], "task.pairs", 1, MAX_PAIRS)
        self.option(task["ablation"], "task.ablation", ABLATIONS)
        self.text(task["description"], "task.description")
        self.array(task["examples"], "task.examples")
        tokens = self.array(task["tokens"], "task.tokens")
        if not tokens:
            raise self.fail("task.tokens", tokens, "the tokens of the first clean prompt (at least one)")
        for i, token in enumerate(tokens):
            self.text(token, f"task.tokens[{i}]")
        self.text(task["units"], "task.units")
        names: set[str] = set()
        for i, score in enumerate(self.array(task["attention_scores"], "task.attention_scores")):
            triple = self.array(score, f"task.attention_scores[{i}]", length=3, why="(name, to, minus)")
            for j, part in enumerate(triple):
                self.text(part, f"task.attention_scores[{i}][{j}]", non_empty=True)
            names.add(triple[0])
        if "ci" in task:
            for key, pair in self.obj(task["ci"], "task.ci", (), ("clean", "corrupted")).items():
                if pair is None:  # a task scan writes every interval it names
                    raise self.fail(f"task.ci.{key}", pair, "an interval [lo, hi] of 2 numbers")
                self.interval(pair, f"task.ci.{key}")
        return n, len(tokens), names

    def settings_of(self, value: Any) -> None:
        from circuitkit.graph.task import ABLATIONS, BOS_RULES
        from circuitkit.tasks.circuit import RANKS
        from circuitkit.uncertainty import MAX_RESAMPLES

        settings = self.obj(value, "settings", ("target", "rank", "ig_steps", "mlps", "edges", "ablation",
                                                "prepend_bos", "tokenization"))
        target = self.number(settings["target"], "settings.target", nullable=False)
        if not 0.0 < target <= 1.0:
            raise self.fail("settings.target", target, "a faithfulness target in (0, 1]")
        self.option(settings["rank"], "settings.rank", RANKS)
        self.integer(settings["ig_steps"], "settings.ig_steps", 1, MAX_STEPS)
        if "ig_points" in settings:
            from circuitkit.graph.runner import IG_POINTS

            self.option(settings["ig_points"], "settings.ig_points", IG_POINTS)
        self.node_ranking = "eap-ig"  # absent (files written before the joint ranking): EAP-IG ordered the nodes
        if "node_ranking" in settings:
            from circuitkit.tasks.circuit import NODE_RANKINGS

            self.node_ranking = self.option(settings["node_ranking"], "settings.node_ranking", NODE_RANKINGS)
        if "kv_edges" in settings:
            from circuitkit.graph.nodes import KV_EDGES

            self.option(settings["kv_edges"], "settings.kv_edges", KV_EDGES)
        for key in ("mlps", "mlp_nodes", "edges"):
            if key in settings:
                self.flag(settings[key], f"settings.{key}")
        self.option(settings["ablation"], "settings.ablation", ABLATIONS)
        self.option(settings["prepend_bos"], "settings.prepend_bos", tuple(BOS_RULES.values()))
        self.text(settings["tokenization"], "settings.tokenization")
        self.text(settings.get("edges_not_measured"), "settings.edges_not_measured", nullable=True)
        self.text(settings.get("device", "cpu"), "settings.device", non_empty=True)
        if "n_resamples" in settings:
            self.integer(settings["n_resamples"], "settings.n_resamples", 2, MAX_RESAMPLES)
        if "ci_level" in settings:
            self.level(settings["ci_level"], "settings.ci_level")
        if "split" in settings:
            split = self.obj(settings["split"], "settings.split", ("holdout", "seed", "target_on", "discovery_pairs",
                                                                   "evaluation_pairs", "note"))
            holdout = self.number(split["holdout"], "settings.split.holdout", 0.0, 1.0, nullable=False)
            if holdout >= 1.0:
                raise self.fail("settings.split.holdout", holdout, "a share of the pairs in [0, 1)")
            self.integer(split["seed"], "settings.split.seed")
            self.option(split["target_on"], "settings.split.target_on", ("discovery", "evaluation", "all pairs"))
            self.integer(split["discovery_pairs"], "settings.split.discovery_pairs", 1)
            self.integer(split["evaluation_pairs"], "settings.split.evaluation_pairs", 0)
            self.text(split["note"], "settings.split.note", nullable=True)
        if "search" in settings:  # which node search ran
            from circuitkit.circuits.search import SEARCH_NAMES

            search = self.obj(settings["search"], "settings.search", ("name", "options", "passes"),
                              ("ranked_size", "stopped"))
            name = self.option(search["name"], "settings.search.name", SEARCH_NAMES)
            self.obj(search["options"], "settings.search.options")
            self.number(search["passes"], "settings.search.passes", 0.0)
            self.integer(search.get("ranked_size"), "settings.search.ranked_size", 1, nullable=True)
            self.text(search.get("stopped"), "settings.search.stopped", nullable=True)
            if name == "ranked" and ("ranked_size" in search or "stopped" in search):
                raise self.fail("settings.search.ranked_size", search.get("ranked_size"), "absent where the node "
                                "circuit is the ranked one (no search ran from it)")
        if "edge_search" in settings:  # which edge search ran
            from circuitkit.tasks.search import EDGE_SEARCH_NAMES

            found = self.obj(settings["edge_search"], "settings.edge_search", ("name", "options", "passes", "pruned"),
                             ("name", "options", "passes", "pruned", "stopped", "ranked_size"))
            name = self.option(found["name"], "settings.edge_search.name", EDGE_SEARCH_NAMES)
            self.obj(found["options"], "settings.edge_search.options")
            self.number(found["passes"], "settings.edge_search.passes", 0.0)
            pruned = self.integer(found["pruned"], "settings.edge_search.pruned", nullable=True)
            self.text(found.get("stopped"), "settings.edge_search.stopped", nullable=True)
            self.integer(found.get("ranked_size"), "settings.edge_search.ranked_size", nullable=True)
            if name == "ranked" and (pruned is not None or found["options"]):
                raise self.fail("settings.edge_search.pruned", pruned, "null and no options where the edge circuit "
                                "is the ranked one (no edge search ran)")
            if settings.get("edges") is False and (found["passes"] is not None or pruned is not None):
                raise self.fail("settings.edge_search.passes", found["passes"], "null, and pruned null, where "
                                "settings.edges is false (no edge circuit, no edge search)")

    def pairs(self, value: Any, n: int) -> None:
        pairs = self.obj(value, "pairs", ("prompts", "marks", "clean", "corrupted"), ("scored",))
        why = f"task.pairs: {n} pairs"
        for i, pair in enumerate(self.array(pairs["prompts"], "pairs.prompts", length=n, why=why)):
            self.obj(pair, f"pairs.prompts[{i}]", ("clean", "corrupted", "answer", "wrong"), ())
        marks = self.array(pairs["marks"], "pairs.marks", nullable=True, length=n, why=why)
        for i, row in enumerate(marks or ()):
            for key, position in self.obj(row, f"pairs.marks[{i}]").items():
                self.integer(position, f"pairs.marks[{i}].{key}")
        scored = self.array(pairs.get("scored"), "pairs.scored", nullable=True, length=n, why=why)
        for i, row in enumerate(scored or ()):
            for j, position in enumerate(self.array(row, f"pairs.scored[{i}]")):
                self.integer(position, f"pairs.scored[{i}][{j}]")
        for side in ("clean", "corrupted"):
            for i, v in enumerate(self.array(pairs[side], f"pairs.{side}", length=n, why=why)):
                self.number(v, f"pairs.{side}[{i}]", nullable=False)

    def heads_of(self, value: Any, own: set[str]) -> None:
        heads = self.obj(value, "heads", ("dla", "score"))
        if heads["dla"] is not None:
            self.grid(heads["dla"], "heads.dla")
        self.array(heads["score"], "heads.score")
        self.grid(heads["score"], "heads.score")
        for name, grid in heads.items():
            if name in ("dla", "score", "joint", "exact"):  # joint: with the settings (ranking); exact: single_heads
                continue
            lo = -1.0 if name in own else 0.0  # the task's own: a difference of two attention fractions
            self.grid(grid, f"heads.{name}", lo, 1.0, SCORE_TOLERANCE)
        missing = sorted(own - set(heads))
        if missing:
            raise self.missing(f"heads.{missing[0]}")

    def single_heads(self, value: Any, heads: dict[str, Any], settings: dict[str, Any]) -> None:
        """The heads patched one at a time (``single_heads``, opt-in: ``settings.ablate``): each a head of the model,
        once; ``heads.exact`` a number at exactly those heads (null elsewhere) and present only beside them;
        intervals of patched heads; the agreement over them (``n_exact`` the heads patched, Spearman in [-1, 1] or
        null, the largest miss a patched head)."""
        from circuitkit.tasks.single_heads import ABLATE_CHOICES

        asked = settings.get("ablate", "none")
        self.option(asked, "settings.ablate", ABLATE_CHOICES)
        if "ablate_top" in settings:
            self.integer(settings["ablate_top"], "settings.ablate_top", 1)
        if value is None:
            if "exact" in heads or asked != "none":
                raise self.missing("single_heads")
            return
        if asked == "none":
            raise self.fail("single_heads", value, "absent where settings.ablate is 'none' (no head was patched "
                                                   "alone)")
        record = self.obj(value, "single_heads", ("heads", "selection", "ci", "agreement"), ())
        patched = self.heads(record["heads"], "single_heads.heads", non_empty=True)
        self.text(record["selection"], "single_heads.selection", non_empty=True)
        if "exact" not in heads:
            raise self.missing("heads.exact")
        self.grid(heads["exact"], "heads.exact")
        measured = {(layer, head) for layer, row in enumerate(heads["exact"]) for head, v in enumerate(row)
                    if v is not None}
        if measured != set(patched):
            raise self.fail("heads.exact", validate.given(f"numbers at {len(measured)} heads"),
                            f"a number at exactly the {len(patched)} heads of single_heads.heads, null elsewhere")
        names = {f"{layer}.{head}" for layer, head in patched}
        for name, pair in self.obj(record["ci"], "single_heads.ci").items():
            if name not in names:
                raise self.fail(f"single_heads.ci.{name}", pair, "an interval of a head of single_heads.heads")
            self.interval(pair, f"single_heads.ci.{name}")
        agreed = self.obj(record["agreement"], "single_heads.agreement", ("n_exact", "spearman", "ci",
                                                                           "largest_miss"), ())
        if self.integer(agreed["n_exact"], "single_heads.agreement.n_exact") != len(patched):
            raise self.fail("single_heads.agreement.n_exact", agreed["n_exact"],
                            f"the heads patched, {len(patched)}")
        self.number(agreed["spearman"], "single_heads.agreement.spearman", -1.0, 1.0, tolerance=SCORE_TOLERANCE)
        self.interval(agreed["ci"], "single_heads.agreement.ci", -1.0, 1.0)
        miss = self.obj(agreed["largest_miss"], "single_heads.agreement.largest_miss", ("head", "exact", "estimate"),
                        (), nullable=True)
        if miss is not None:
            if self.head(miss["head"], "single_heads.agreement.largest_miss.head") not in set(patched):
                raise self.fail("single_heads.agreement.largest_miss.head", miss["head"], "a patched head")
            for key in ("exact", "estimate"):
                self.number(miss[key], f"single_heads.agreement.largest_miss.{key}", nullable=False)

    def ranking(self, heads: dict[str, Any], mlps: dict[str, Any], settings: dict[str, Any]) -> None:
        """The joint path's shares that ordered the nodes (``heads.joint``, ``mlps.joint``): there exactly where
        ``settings.node_ranking`` is ``"joint"``; ``mlps.joint`` a share per MLP where the MLPs were nodes."""
        joint = self.node_ranking == "joint"
        for where, given in (("heads", heads), ("mlps", mlps)):
            if ("joint" in given) != joint:
                raise (self.missing(f"{where}.joint") if joint else self.fail(
                    f"{where}.joint", given["joint"], "no such key where settings.node_ranking is not 'joint'"))
        if not joint:
            return
        self.grid(heads["joint"], "heads.joint")
        shares = self.array(mlps["joint"], "mlps.joint", nullable=True, length=self.n_layers,
                            why=f"one per layer: {self.n_layers}")
        for i, v in enumerate(shares or ()):
            self.number(v, f"mlps.joint[{i}]")
        if (shares is not None) != bool(settings.get("mlp_nodes") and settings.get("mlps")):
            raise self.fail("mlps.joint", mlps["joint"], "one share per MLP where the MLPs were nodes "
                                                         "(settings.mlp_nodes and settings.mlps), else null")

    def mlps(self, value: Any, settings: dict[str, Any]) -> None:
        mlps = self.obj(value, "mlps", ("dla", "score"), ("joint",))
        for key in ("dla", "score"):
            for i, v in enumerate(self.array(mlps[key], f"mlps.{key}", nullable=True, length=self.n_layers,
                                             why=f"one per layer: {self.n_layers}") or ()):
                self.number(v, f"mlps.{key}[{i}]")
        if (mlps["score"] is None) == bool(settings["mlps"]):
            raise self.fail("mlps.score", mlps["score"], "one score per MLP where settings.mlps is true, else null")

    def patterns(self, value: Any, tokens: int) -> None:
        for layer, heads in enumerate(self.array(value, "patterns", length=self.n_layers)):
            for head, rows in enumerate(self.array(heads, f"patterns[{layer}]", length=self.n_heads)):
                at = f"patterns[{layer}][{head}]"
                for q, row in enumerate(self.array(rows, at, length=tokens, why=f"task.tokens: {tokens}")):
                    for k, v in enumerate(self.array(row, f"{at}[{q}]", length=tokens, why=f"task.tokens: {tokens}")):
                        self.number(v, f"{at}[{q}][{k}]", 0.0, 1.0, nullable=False, tolerance=SCORE_TOLERANCE)

    def mlp(self, value: Any, field: str) -> int:
        return self.integer(value, field, 0, self.n_layers - 1)

    def node(self, text: Any, field: str, *, receiver: bool) -> float:
        """The position of an edge's sender or receiver in the model's order (input -1, layer ``l``'s heads ``l``,
        its MLP ``l + 0.5``, the logits ``L``), checked to exist."""
        match = (RECEIVER if receiver else SENDER).fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise self.fail(field, text, "an edge 'sender->receiver' of the task graph (senders: input, L.H, mN; "
                                         "receivers: L.H:q|k|v, L.gG:k|v, mN, logits)")
        if text in ("input", "logits"):
            return -1.0 if text == "input" else float(self.n_layers)
        if match.group(1) is not None:
            return self.mlp(int(match.group(1)), field) + 0.5
        layer, index = int(match.group(2)), int(match.group(3) if not receiver else match.group(4))
        groups = self.n_heads
        kv = int(self.data["model"].get("n_kv_heads") or self.n_heads)
        if receiver and match.group(3):
            groups = kv
        # a key/value receiver is its group's (grouped, on a grouped-query model) or its query head's
        per_head = self.data["settings"].get("kv_edges", "grouped") == "per-query-head" or kv == self.n_heads
        if receiver and match.group(5) in "kv" and bool(match.group(3)) == per_head:
            raise self.fail(field, text, "a key/value receiver of the scan's graph: L.H:k|v (each query head's own: "
                                         "settings.kv_edges 'per-query-head', or one key/value head per query head) "
                                         "or L.gG:k|v (its group's: 'grouped' on a grouped-query model)")
        if not (0 <= layer < self.n_layers and 0 <= index < groups):
            raise self.fail(field, text, f"a node of the model: layer in [0, {self.n_layers - 1}], head (or key-value "
                                         f"group) in [0, {groups - 1}]")
        return float(layer)

    def edge_name(self, text: Any, field: str) -> None:
        sender, arrow, receiver = text.partition("->") if isinstance(text, str) else ("", "", "")
        if not arrow:
            raise self.fail(field, text, "an edge written 'sender->receiver'")
        if self.node(sender, field, receiver=False) >= self.node(receiver, field, receiver=True):
            raise self.fail(field, text, "an edge from an earlier node to a later one")

    def points(self, value: Any, field: str, total: int) -> None:
        for i, point in enumerate(self.array(value, field)):
            at = f"{field}[{i}]"
            point = self.obj(point, at, ("size", "faithfulness", "metric"), ("fraction",))
            self.integer(point["size"], f"{at}.size", 0, total)
            self.number(point["faithfulness"], f"{at}.faithfulness", nullable=False)
            self.number(point["metric"], f"{at}.metric", nullable=False)

    def circuit(self, value: Any) -> None:  # noqa: C901 - one field after another
        from circuitkit.tasks.circuit import NODE_RANKINGS, RANKS

        c = self.obj(value, "circuit", CIRCUIT_REQUIRED, ("ci", "explanations", "nodes", "cpr_cmd", "search",
                                                          "edge_search", "ranked_by"), nullable=True)
        if c is None:
            return
        for name, labels in self.obj(c.get("nodes", {}), "circuit.nodes").items():  # further node types' members
            known = self.node_labels.get(name)
            if known is None:
                raise self.fail("circuit.nodes", name, f"a node type of the scan's nodes ({sorted(self.node_labels)})")
            items = self.array(labels, f"circuit.nodes.{name}")
            if not items or len(set(map(str, items))) != len(items) or not set(map(str, items)) <= known:
                raise self.fail(f"circuit.nodes.{name}", labels, f"distinct labels of its {name} nodes, at least one")
        members = set(self.heads(c["heads"], "circuit.heads"))
        if c.get("explanations") is not None:
            self.explanations(c["explanations"], members)
        mlps = [self.mlp(m, f"circuit.mlps[{i}]") for i, m in enumerate(self.array(c["mlps"], "circuit.mlps"))]
        if len(set(mlps)) != len(mlps):
            raise self.fail("circuit.mlps", c["mlps"], "each MLP at most once")
        for key in ("faithfulness", "necessity", "metric_all_nodes_patched", "metric_clean", "metric_corrupted"):
            self.number(c[key], f"circuit.{key}", nullable=False)
        measured = [self.number(c[key], f"circuit.{key}") is not None for key in ("edge_faithfulness", "cpr", "cmd")]
        if any(measured) and not all(measured):
            raise self.fail("circuit.edge_faithfulness", c["edge_faithfulness"], "edge_faithfulness, cpr and cmd all "
                                                                                 "numbers (edges measured) or all null")
        if not any(measured) and (c["edges"] or c["edge_curve"] or c["edge_effects"]):
            raise self.fail("circuit.edges", c["edges"], "no edges, edge curve or edge effects where the edge circuit "
                                                         "was not measured (edge_faithfulness null)")
        target = self.number(c["target"], "circuit.target", nullable=False)
        if not 0.0 < target <= 1.0:
            raise self.fail("circuit.target", target, "a faithfulness target in (0, 1]")
        from circuitkit.graph.task import ABLATIONS

        self.option(c["ablation"], "circuit.ablation", ABLATIONS)
        self.option(c["rank"], "circuit.rank", RANKS)
        if "ranked_by" in c:  # absent from files written before the joint ranking: EAP-IG ranked them
            self.option(c["ranked_by"], "circuit.ranked_by", NODE_RANKINGS)
            if c["ranked_by"] != self.node_ranking:
                raise self.fail("circuit.ranked_by", c["ranked_by"], f"the ranking the settings name "
                                                                      f"({self.node_ranking!r})")
        elif self.node_ranking != "eap-ig":
            raise self.fail("circuit", validate.given("no ranked_by"), f"circuit.ranked_by {self.node_ranking!r}, as "
                                                                       "settings.node_ranking says")
        further = sum(len(labels) for labels in self.node_labels.values())
        nodes = self.integer(c["nodes_total"], "circuit.nodes_total", 1,
                             self.n_layers * (self.n_heads + 1) + further)
        if len(c["heads"]) + len(mlps) + sum(len(v) for v in c.get("nodes", {}).values()) > nodes:
            raise self.fail("circuit.nodes_total", nodes, "at least the circuit's heads and MLPs")
        self.points(c["curve"], "circuit.curve", nodes)
        edges = self.array(c["edges"], "circuit.edges")
        for i, edge in enumerate(edges):
            self.edge_name(edge, f"circuit.edges[{i}]")
        if len(set(edges)) != len(edges):
            raise self.fail("circuit.edges", edges, "each edge at most once")
        total = self.integer(c["edges_total"], "circuit.edges_total", len(edges))
        self.points(c["edge_curve"], "circuit.edge_curve", total)
        if c["edge_curve"] and total == 0:
            raise self.fail("circuit.edges_total", total, "at least one edge beside an edge curve")
        for i, effect in enumerate(self.array(c["edge_effects"], "circuit.edge_effects")):
            at = f"circuit.edge_effects[{i}]"
            effect = self.obj(effect, at, ("edge", "score", "effect"), ("ci", "clean", "patched"))
            self.edge_name(effect["edge"], f"{at}.edge")
            self.number(effect["score"], f"{at}.score", nullable=False)
            self.number(effect["effect"], f"{at}.effect", nullable=False)
            if "clean" in effect or "patched" in effect:  # a scan written before the metric's means has neither
                clean = self.number(effect.get("clean"), f"{at}.clean", nullable=False)
                patched = self.number(effect.get("patched"), f"{at}.patched", nullable=False)
                if abs(effect["effect"] - (clean - patched)) > 1e-6 * max(1.0, abs(clean), abs(patched)):
                    raise self.fail(f"{at}.effect", effect["effect"],
                                    f"the behaviour lost, clean - patched = {clean - patched!r}")
            if effect.get("ci") is not None:  # a scan written before the effects had intervals has none
                self.whole_interval(effect["ci"], f"{at}.ci")
        self.mib_areas(c.get("cpr_cmd"), c, total)
        if "ci" in c:
            for key, pair in self.obj(c["ci"], "circuit.ci").items():
                self.whole_interval(pair, f"circuit.ci.{key}")
        other = self.obj(c["other_set"], "circuit.other_set", ("set", "pairs"), nullable=True)
        if other is not None:
            self.option(other["set"], "circuit.other_set.set", ("discovery", "evaluation"))
            self.integer(other["pairs"], "circuit.other_set.pairs", 1)
            for key in ("necessity", "clean", "corrupted", "metric_all_nodes_patched"):
                self.number(other.get(key), f"circuit.other_set.{key}", nullable=False)
            for key in ("faithfulness", "edge_faithfulness"):
                self.number(other.get(key), f"circuit.other_set.{key}")
            self.text(other.get("note"), "circuit.other_set.note", nullable=True)
            for key, pair in self.obj(other.get("ci", {}), "circuit.other_set.ci", (),
                                      ("faithfulness", "necessity", "edge_faithfulness")).items():
                self.whole_interval(pair, f"circuit.other_set.ci.{key}")
            if "curve" in other:
                self.points(other["curve"], "circuit.other_set.curve", nodes)
        self.searches(c, nodes, total)

    def searches(self, c: dict[str, Any], nodes: int, total: int) -> None:
        """``circuit.search`` and ``circuit.edge_search``, the records of the node and edge searches beyond ranking
        (:meth:`circuitkit.circuits.search.SearchResult.to_json`, as the induction circuit's ``circuit.search``):
        absent where ``settings.search`` / ``settings.edge_search`` is ranked (files written before the record
        also lack it where a search ran), else of that search, of the circuit's size and faithfulness, started from a
        size of the ranked curve."""
        settings = self.data.get("settings") or {}
        for key, kind, members, size, faithfulness, curve, most in (
                ("search", "node", "circuit.heads and circuit.mlps", len(c["heads"]) + len(c["mlps"]),
                 c["faithfulness"], "curve", nodes),
                ("edge_search", "edge", "circuit.edges", len(c["edges"]), c["edge_faithfulness"], "edge_curve",
                 total)):
            at = f"circuit.{key}"
            if key not in c:
                continue
            entry = settings.get(key) if isinstance(settings, dict) else None
            name = entry.get("name", "ranked") if isinstance(entry, dict) else "ranked"
            if name == "ranked" or faithfulness is None:
                raise self.fail(at, c[key], f"absent: settings.{key} names no {kind} search beyond ranking")
            self.search_record(c[key], at, name, size, faithfulness, {p["size"] for p in c[curve]}, most, members,
                               f"circuit.{curve}")


    def whole_interval(self, value: Any, field: str) -> None:
        """An interval a task scan writes: ``[lo, hi]`` of two numbers, never null nor holding one (a task scan
        names an interval only once it has both ends)."""
        pair = self.array(value, field)
        if len(pair) != 2 or any(end is None for end in pair):
            raise self.fail(field, value, "an interval [lo, hi] of 2 numbers")
        self.interval(pair, field)

    def mib_areas(self, value: Any, c: dict[str, Any], total: int) -> None:
        """``circuit.cpr_cmd`` (MIB's curves and areas, :func:`circuitkit.tasks.circuit.mib_areas`): its CPR and CMD
        are the circuit's, one size and one faithfulness per fraction."""
        from circuitkit.tasks.circuit import EDGE_FRACTIONS, RANKS

        areas = self.obj(value, "circuit.cpr_cmd", ("definition", "cpr", "cmd", "fractions", "sizes", *RANKS), (),
                         nullable=True)
        if areas is None:
            return
        self.text(areas["definition"], "circuit.cpr_cmd.definition", non_empty=True)
        for key in ("cpr", "cmd"):
            value = self.number(areas[key], f"circuit.cpr_cmd.{key}", nullable=False)
            if not isinstance(c[key], (int, float)) or abs(value - c[key]) > 1e-6 * max(1.0, abs(value)):
                raise self.fail(f"circuit.cpr_cmd.{key}", areas[key], f"circuit.{key} ({c[key]})")
        n = len(EDGE_FRACTIONS)
        for i, x in enumerate(self.array(areas["fractions"], "circuit.cpr_cmd.fractions", length=n)):
            self.number(x, f"circuit.cpr_cmd.fractions[{i}]", 0.0, 1.0, nullable=False)
        for i, size in enumerate(self.array(areas["sizes"], "circuit.cpr_cmd.sizes", length=n)):
            self.integer(size, f"circuit.cpr_cmd.sizes[{i}]", 0, total)
        for rank in RANKS:
            curve = self.obj(areas[rank], f"circuit.cpr_cmd.{rank}", ("faithfulness", "area_under", "area_from_1"), ())
            for i, f in enumerate(self.array(curve["faithfulness"], f"circuit.cpr_cmd.{rank}.faithfulness", length=n)):
                self.number(f, f"circuit.cpr_cmd.{rank}.faithfulness[{i}]", nullable=False)
            for key in ("area_under", "area_from_1"):
                self.number(curve[key], f"circuit.cpr_cmd.{rank}.{key}", nullable=False)


def check_task_scores(data: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
    """Refuse ``data`` (a parsed task ``scores.json`` of the current format) unless a task scan could have written
    it (the module docstring lists the rules); ``where`` names the file in the error; ``extra``: top-level keys
    allowed beside the known ones (the fields of the scan class, which a newer scan writes under their names)."""
    TaskScoresCheck(data, where, extra).run()


__all__ = ["check_task_scores"]
