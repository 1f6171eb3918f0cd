"""Every rule a computed scan satisfies, checked on a parsed ``scores.json`` before :func:`scan_from_json` builds it.

Why: ``Scan.load`` reads files that other versions, other people or an editor wrote. A file that says a model has
0 layers, or 3 layers beside grids of 2 rows, a head ``"9.9"`` in a 2 x 4 model, ``Infinity`` or ``true`` as an
attention score in [0, 1], or ``n_resamples`` -5 would otherwise load, print tables and be saved again as a report
of a scan that never ran. A computed scan cannot hold any of these, so a loaded one must not either.

The rules (``L`` = ``model.n_layers``, ``H`` = ``model.n_heads``):

- **types** as ``scores.schema.json`` says (ints are ints, not bools or ``2.0``; strings are strings);
- **finite**: no number anywhere is ``NaN`` or infinite (``scores.json`` writes them as null), no integer exceeds
  :data:`MAX_INT`;
- **ranges**: the model's sizes are positive and at most :data:`MAX_LAYERS` / :data:`MAX_HEADS`; pattern scores
  lie in [0, 1], the copying score in [-1, 1], composition scores in [0, 1], losses >= 0, Spearman in [-1, 1],
  intervals ``lo <= hi``; every setting in the range :func:`circuitkit.scan` accepts (``target`` in (0, 1],
  ``n_resamples`` >= 2, ...);
- **shapes**: every ``[layer][head]`` grid (scores, effects, intervals) is exactly ``L x H``;
- **heads exist**: every ``"layer.head"`` names a head of an ``L x H`` model; composition edges and circuit
  edges run from an earlier layer to a later one;
- **cross-field**: the score definitions and grids name the same scores; the roles read computed scores; edge
  evidence only where the settings measured edges.

What depends on other fields (the ranked ``top_heads``, ``uncertainty`` beside ``settings``) is checked after the
build, by writing the loaded scan again and comparing (:func:`first_difference`). Each failure is one
:class:`~circuitkit.CircuitkitError` line naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError

MAX_LAYERS = 4096
"""The largest ``n_layers`` a file may state (the largest released models have about 130)."""
MAX_HEADS = 4096
"""The largest ``n_heads`` a file may state (the largest released models have about 128)."""
MAX_INT = 2**63 - 1
"""No integer ``scores.json`` writes exceeds int64 (the largest is a seed)."""
MAX_SIZE = 2**31 - 1
"""Sizes of the batch (``block_len``, ``batch``, ``top_k``, ...): int32 keeps them within any tensor's index."""
SCORE_TOLERANCE = 1e-6
"""Slack on the [0, 1] and [-1, 1] ranges: a float32 sum of attention weights exceeds 1 by a few ulps."""
RELATIVE_TOLERANCE = 1e-6
"""Two numbers agree when written again if they agree to 7 significant digits (``scores.json``'s rounding)."""

HEAD = re.compile(r"^(\d{1,9})\.(\d{1,9})$")
TOP_LEVEL = ("format", "circuitkit_version", "units", "model", "settings", "scores", "head_scores", "top_heads",
             "induction_loss", "attribution", "ablation", "agreement", "composition", "circuit", "circuit_error",
             "evidence", "circuit_ablation")
OPTIONAL_TOP_LEVEL = ("circuit_ablation_ci", "head_scores_ci", "uncertainty")
MODEL_REQUIRED = ("name", "n_layers", "n_heads", "d_model", "d_head")
MODEL_OPTIONAL = ("d_vocab", "n_ctx", "n_kv_heads", "attn_only", "family")
SETTINGS_REQUIRED = ("block_len", "n_repeats", "batch", "seed", "ablate", "ablate_top", "ablation_method", "top_k",
                     "n_patch", "target", "faithfulness_method", "attribution_method", "attribution_steps", "roles")
SETTINGS_OPTIONS = {"ablate": ("top", "all", "none"), "ablation_method": ("mean", "zero"),
                    "faithfulness_method": ("mean", "zero", "resample"), "circuit_rank": ("joint", "effect", "auto"),
                    "attribution_method": ("gradient", "ig"), "search": ("refined", "masks")}
CHANNELS = ("q", "k", "v", "all")
EVIDENCE_KEYS = ("src", "dst", "channel", "weight_only", "effect_only", "name")
SCORE_RANGES = {"pattern": (0.0, 1.0)}
"""The range of each kind of head score (a pattern score is a fraction of attention); weight scores by name:"""
WEIGHT_SCORE_RANGES = {"copying": (-1.0, 1.0)}


class ScoresCheck:
    """The checks of one parsed ``scores.json`` (``where`` names the file in every error)."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        self.n_layers = 0
        self.n_heads = 0

    unknown_key = "no such key (scores.json format 4 does not have it)"
    """What a key no scan writes is told it should be (a subclass for another file names its own format)."""

    # ------------------------------------------------------------------------------------------ primitives
    def fail(self, field: str, value: Any, expected: str) -> CircuitkitError:
        return validate.fail(f"{self.where}, field {field!r}", value, expected)

    def missing(self, field: str) -> CircuitkitError:
        return self.fail(field, validate.given("nothing (the key is missing)"), "the key to be present")

    def obj(self, value: Any, field: str, required: tuple[str, ...] = (), allowed: tuple[str, ...] | None = None,
            *, nullable: bool = False) -> dict[str, Any] | None:
        """``value`` as a JSON object holding ``required`` keys (and, with ``allowed``, no others)."""
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            raise self.fail(field, value, "a JSON object" + (" or null" if nullable else ""))
        for key in required:
            if key not in value:
                raise self.missing(f"{field}.{key}" if field else key)
        if allowed is not None:
            extra = [key for key in value if key not in required and key not in allowed]
            if extra:
                raise self.fail(f"{field}.{extra[0]}" if field else extra[0], value[extra[0]], self.unknown_key)
        return value

    def array(self, value: Any, field: str, *, nullable: bool = False, length: int | None = None,
              why: str = "") -> list | None:
        if value is None and nullable:
            return None
        if not isinstance(value, list):
            raise self.fail(field, value, "a JSON array" + (" or null" if nullable else ""))
        if length is not None and len(value) != length:
            raise self.fail(field, validate.given(f"an array of {len(value)} entries"),
                            f"{length} entries ({why or f'model: {self.n_layers} layers x {self.n_heads} heads'})")
        return value

    def text(self, value: Any, field: str, *, nullable: bool = False, non_empty: bool = False) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or (non_empty and not value.strip()):
            raise self.fail(field, value, ("a non-empty string" if non_empty else "a string")
                            + (" or null" if nullable else ""))
        return value

    def option(self, value: Any, field: str, options: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in options:
            raise self.fail(field, value, f"one of {list(options)}")
        return value

    def flag(self, value: Any, field: str, *, nullable: bool = False) -> bool | None:
        if value is None and nullable:
            return None
        if not isinstance(value, bool):
            raise self.fail(field, value, "true or false" + (" or null" if nullable else ""))
        return value

    def integer(self, value: Any, field: str, minimum: int = 0, maximum: int = MAX_INT, *,
                nullable: bool = False) -> int | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.fail(field, value, f"an integer in [{minimum}, {maximum}] (not a bool, not a float)"
                            + (" or null" if nullable else ""))
        return value

    def number(self, value: Any, field: str, lo: float = -math.inf, hi: float = math.inf, *,
               nullable: bool = True, tolerance: float = 0.0) -> float | None:
        """A finite JSON number in ``[lo, hi]`` (null allowed with ``nullable``: NaN as ``scores.json`` writes it)."""
        if value is None and nullable:
            return None
        bounds = "" if (lo, hi) == (-math.inf, math.inf) else f" in [{lo}, {hi}]"
        expected = f"a finite number{bounds}" + (" or null" if nullable else "") + " (not a bool, not a string)"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(field, value, expected)
        if not math.isfinite(value) or not lo - tolerance <= value <= hi + tolerance:
            raise self.fail(field, value, expected)
        return float(value)

    def head(self, value: Any, field: str) -> tuple[int, int]:
        """A ``"layer.head"`` of the model (evidence rows write ``[layer, head]``)."""
        if isinstance(value, list) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            layer, index = value
        else:
            match = HEAD.fullmatch(value) if isinstance(value, str) else None
            if match is None:
                raise self.fail(field, value, "a head written as 'layer.head'")
            layer, index = int(match.group(1)), int(match.group(2))
        if not (0 <= layer < self.n_layers and 0 <= index < self.n_heads):
            raise self.fail(field, value, f"a head of the model: layer in [0, {self.n_layers - 1}], head in "
                                          f"[0, {self.n_heads - 1}]")
        return layer, index

    def heads(self, value: Any, field: str, *, non_empty: bool = False) -> list[tuple[int, int]]:
        items = self.array(value, field)
        out = [self.head(item, f"{field}[{i}]") for i, item in enumerate(items)]
        if len(set(out)) != len(out):
            raise self.fail(field, value, "each head at most once")
        if non_empty and not out:
            raise self.fail(field, value, "at least one head")
        return out

    def edge(self, src: Any, dst: Any, field: str) -> None:
        """A composition or circuit edge: from a head of an earlier layer to a head of a later one."""
        a = self.head(src, f"{field}.src")
        b = self.head(dst, f"{field}.dst")
        if a[0] >= b[0]:
            raise self.fail(f"{field}.dst", dst, f"a head in a later layer than the edge's source {src!r}")

    def grid(self, value: Any, field: str, lo: float = -math.inf, hi: float = math.inf,
             tolerance: float = 0.0) -> None:
        """A ``[layer][head]`` grid of exactly ``L x H`` numbers or nulls in ``[lo, hi]``."""
        for layer, row in enumerate(self.array(value, field, length=self.n_layers)):
            for index, cell in enumerate(self.array(row, f"{field}[{layer}]", length=self.n_heads)):
                self.number(cell, f"{field}[{layer}][{index}]", lo, hi, tolerance=tolerance)

    def explanations(self, value: Any, members: set[tuple[int, int]]) -> None:
        """``circuit.explanations`` (either kind of scan): what each member does, in words, an entry of non-empty
        text for every head of ``members`` and no other. Held here: a reload writes the words again in this
        version's wording and does not compare them (:func:`circuitkit.report.reload.comparable`)."""
        explained = self.obj(value, "circuit.explanations")
        for name, text in explained.items():
            if self.head(name, "circuit.explanations") not in members:
                raise self.fail("circuit.explanations", name, "a head of circuit.heads")
            self.text(text, f"circuit.explanations.{name}", non_empty=True)
        missing = sorted(members - {self.head(name, "circuit.explanations") for name in explained})
        if missing:
            raise self.fail("circuit.explanations", validate.given(f"no entry for {missing[0][0]}.{missing[0][1]}"),
                            "an explanation of every head of circuit.heads")

    def interval(self, value: Any, field: str, lo: float = -math.inf, hi: float = math.inf) -> None:
        """``[lo, hi]`` (entries finite numbers or null, ``lo <= hi``), or null."""
        if value is None:
            return
        pair = self.array(value, field)
        if len(pair) != 2:
            raise self.fail(field, value, "an interval [lo, hi] of 2 entries, or null")
        a = self.number(pair[0], f"{field}[0]", lo, hi, tolerance=SCORE_TOLERANCE if math.isfinite(hi) else 0.0)
        b = self.number(pair[1], f"{field}[1]", lo, hi, tolerance=SCORE_TOLERANCE if math.isfinite(hi) else 0.0)
        if a is not None and b is not None and a > b:
            raise self.fail(field, value, "an interval [lo, hi] with lo <= hi")

    def level(self, value: Any, field: str) -> None:
        """A confidence level, strictly between 0 and 1."""
        if self.number(value, field, 0.0, 1.0, nullable=False) in (0.0, 1.0):
            raise self.fail(field, value, "a confidence level strictly between 0 and 1")

    def interval_grid(self, value: Any, field: str) -> None:
        if value is None:
            return
        for layer, row in enumerate(self.array(value, field, length=self.n_layers)):
            for index, cell in enumerate(self.array(row, f"{field}[{layer}]", length=self.n_heads)):
                self.interval(cell, f"{field}[{layer}][{index}]")

    def intervals(self, value: Any, field: str) -> None:
        """An object of intervals (``ci`` beside a group of figures)."""
        for key, pair in self.obj(value, field).items():
            self.interval(pair, f"{field}.{key}")

    def plain_numbers(self, data: dict[str, Any]) -> None:
        """Every number of the file finite (scores.json writes NaN and infinities as null) and of a bounded size."""
        if not _all_plain(data):
            for path, value in _numbers(data, ""):
                if isinstance(value, float) and not math.isfinite(value):
                    raise self.fail(path, value, "a finite number or null (scores.json writes NaN and infinities as "
                                                 "null)")
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                    raise self.fail(path, validate.given(f"an integer of {len(str(abs(value)))} digits"),
                                    f"an integer of at most {MAX_INT} in size")

    # ------------------------------------------------------------------------------------------ sections
    def run(self) -> None:
        data = self.obj(self.data, "", TOP_LEVEL, OPTIONAL_TOP_LEVEL + tuple(
            key for key in self.data if isinstance(key, str) and key.endswith("_heads") and key != "top_heads"))
        self.plain_numbers(data)
        self.text(data["circuitkit_version"], "circuitkit_version")
        for key, unit in self.obj(data["units"], "units").items():
            self.text(unit, f"units.{key}")
        self.model(data["model"])
        scores = self.head_scores(data)
        self.settings(data["settings"], scores)
        self.top_heads(data["top_heads"], scores, data)
        for key in data:
            if key.endswith("_heads") and key != "top_heads":
                if key.removesuffix("_heads") not in scores:
                    raise self.fail(key, data[key], f"the heads of a computed score (one of {sorted(scores)})")
                self.heads(data[key], key)
        self.induction_loss(data["induction_loss"])
        self.effects(data["attribution"], "attribution")
        self.effects(data["ablation"], "ablation")
        self.agreement(data["agreement"])
        self.composition(data["composition"])
        self.circuit(data["circuit"], data["settings"].get("search", "ranked"))
        self.text(data["circuit_error"], "circuit_error", nullable=True)
        self.evidence(data["evidence"], data["settings"])
        for label, value in self.obj(data["circuit_ablation"], "circuit_ablation").items():
            self.number(value, f"circuit_ablation.{label}")
        self.uncertainty(data, scores)

    def model(self, value: Any) -> None:
        model = self.obj(value, "model", MODEL_REQUIRED, MODEL_OPTIONAL)
        self.text(model["name"], "model.name")
        self.n_layers = self.integer(model["n_layers"], "model.n_layers", 1, MAX_LAYERS)
        self.n_heads = self.integer(model["n_heads"], "model.n_heads", 1, MAX_HEADS)
        for key in ("d_model", "d_head", "d_vocab", "n_ctx"):
            if key in model:
                self.integer(model[key], f"model.{key}", 1, MAX_SIZE, nullable=key not in MODEL_REQUIRED)
        kv = self.integer(model.get("n_kv_heads"), "model.n_kv_heads", 1, self.n_heads, nullable=True)
        if kv is not None and self.n_heads % kv:
            raise self.fail("model.n_kv_heads", kv, f"a divisor of model.n_heads ({self.n_heads})")
        self.flag(model.get("attn_only"), "model.attn_only", nullable=True)
        self.text(model.get("family"), "model.family", nullable=True)

    def head_scores(self, data: dict[str, Any]) -> dict[str, str]:
        """The computed scores (name -> kind), their definitions and grids checked."""
        definitions = self.obj(data["scores"], "scores")
        grids = self.obj(data["head_scores"], "head_scores")
        if list(definitions) != list(grids):
            raise self.fail("scores", validate.given(f"definitions of {list(definitions)}"),
                            f"one definition per head_scores grid, in its order ({list(grids)})")
        kinds = {}
        for name, grid in grids.items():
            d = self.obj(definitions[name], f"scores.{name}", ("short", "description", "kind", "neutral"), ())
            self.text(d["short"], f"scores.{name}.short", non_empty=True)
            self.text(d["description"], f"scores.{name}.description")
            kind = self.option(d["kind"], f"scores.{name}.kind", ("pattern", "weight"))
            lo, hi = SCORE_RANGES.get(kind) or WEIGHT_SCORE_RANGES.get(name, (-math.inf, math.inf))
            self.number(d["neutral"], f"scores.{name}.neutral", lo, hi, tolerance=SCORE_TOLERANCE)
            self.grid(grid, f"head_scores.{name}", lo, hi, SCORE_TOLERANCE)
            kinds[name] = kind
        return kinds

    def settings(self, value: Any, scores: dict[str, str]) -> None:
        from circuitkit.circuits.faithfulness import check_repeats
        from circuitkit.scan_record import ScanSettings
        from circuitkit.uncertainty import MAX_RESAMPLES

        known = tuple(f.name for f in dataclasses.fields(ScanSettings) if f.metadata.get("saved", True))
        settings = self.obj(value, "settings", SETTINGS_REQUIRED, known)
        for key in ("block_len", "n_repeats", "batch", "ablate_top", "top_k", "n_patch", "attribution_steps",
                    "heads_per_score", "edges_per_mode", "edges_listed", "edge_attribution_steps"):
            if key in settings:
                self.integer(settings[key], f"settings.{key}", 1, MAX_SIZE,
                             nullable=key == "edge_attribution_steps")
        self.integer(settings["seed"], "settings.seed", 0, MAX_INT)
        self.integer(settings.get("evaluation_seed"), "settings.evaluation_seed", 0, MAX_INT, nullable=True)
        self.integer(settings.get("bos"), "settings.bos", 0, MAX_SIZE, nullable=True)
        self.text(settings.get("device", "cpu"), "settings.device", non_empty=True)
        for key, options in SETTINGS_OPTIONS.items():
            if key in settings:
                self.option(settings[key], f"settings.{key}", options)
        self.number(settings["target"], "settings.target", nullable=False)
        if not 0.0 < settings["target"] <= 1.0:
            raise self.fail("settings.target", settings["target"], "a faithfulness target in (0, 1]")
        if "n_resamples" in settings:
            self.integer(settings["n_resamples"], "settings.n_resamples", 2, MAX_RESAMPLES)
        if "ci_level" in settings:
            self.level(settings["ci_level"], "settings.ci_level")
        for key in ("random_sets", "stability"):
            if key in settings:
                try:
                    check_repeats("", settings[key])
                except CircuitkitError:
                    raise self.fail(f"settings.{key}", settings[key], "0 (none) or an integer in [2, 10000]") from None
        roles = {}
        for i, text in enumerate(self.array(settings["roles"], "settings.roles")):
            match = re.fullmatch(r"([^:]+): (\S+)(?: feeding (.+))?", text) if isinstance(text, str) else None
            if match is None:
                raise self.fail(f"settings.roles[{i}]", text, "a role written as 'name: score' or 'name: score "
                                                             "feeding role'")
            if match.group(2) not in scores:
                raise self.fail(f"settings.roles[{i}]", text, f"a role read from a computed score ({sorted(scores)})")
            roles[match.group(1)] = match.group(3)
        for feeds in roles.values():
            if feeds is not None and feeds not in roles:
                raise self.fail("settings.roles", feeds, f"a role that feeds another of the scan's roles "
                                                         f"({sorted(roles)})")

    def ranked(self, value: Any, field: str, lo: float = -math.inf, hi: float = math.inf) -> None:
        for i, record in enumerate(self.array(value, field)):
            at = f"{field}[{i}]"
            r = self.obj(record, at, ("head", "layer", "index", "value"), ("ci",))
            layer, index = self.head(r["head"], f"{at}.head")
            if r["layer"] != layer or isinstance(r["layer"], bool):
                raise self.fail(f"{at}.layer", r["layer"], f"the layer of head {r['head']!r} ({layer})")
            if r["index"] != index or isinstance(r["index"], bool):
                raise self.fail(f"{at}.index", r["index"], f"the index of head {r['head']!r} ({index})")
            self.number(r["value"], f"{at}.value", lo, hi, tolerance=SCORE_TOLERANCE)
            self.interval(r.get("ci"), f"{at}.ci")

    def top_heads(self, value: Any, scores: dict[str, str], data: dict[str, Any]) -> None:
        top = self.obj(value, "top_heads")
        for name, records in top.items():
            if name not in scores and not (name in ("attribution", "ablation") and data.get(name) is not None):
                raise self.fail(f"top_heads.{name}", records, f"the top heads of a computed score ({sorted(scores)}, "
                                                              "attribution or ablation where measured)")
            self.ranked(records, f"top_heads.{name}")

    def induction_loss(self, value: Any) -> None:
        loss = self.obj(value, "induction_loss", ("first_copy", "repeated_copies", "per_position"), ("ci",),
                        nullable=True)
        if loss is None:
            return
        self.number(loss["first_copy"], "induction_loss.first_copy", 0.0)
        self.number(loss["repeated_copies"], "induction_loss.repeated_copies", 0.0)
        settings = self.data["settings"]
        n = settings["block_len"] * settings["n_repeats"] + (settings.get("bos") is not None) - 1
        for i, v in enumerate(self.array(loss["per_position"], "induction_loss.per_position", nullable=True,
                                         length=n, why="one per predicted position: settings.block_len x "
                                                        "n_repeats, + 1 with a BOS, - 1") or ()):
            self.number(v, f"induction_loss.per_position[{i}]", 0.0)
        if "ci" in loss:
            self.intervals(loss["ci"], "induction_loss.ci")

    def effects(self, value: Any, kind: str) -> None:
        required = ("method", "steps", "ablation_method", "clean_loss", "effect", "top") if kind == "attribution" \
            else ("method", "clean_loss", "effect", "top", "ablated")
        record = self.obj(value, kind, required, ("ci",), nullable=True)
        if record is None:
            return
        if kind == "attribution":
            self.option(record["method"], f"{kind}.method", SETTINGS_OPTIONS["attribution_method"])
            self.integer(record["steps"], f"{kind}.steps", 1, MAX_SIZE)
            self.option(record["ablation_method"], f"{kind}.ablation_method", SETTINGS_OPTIONS["ablation_method"])
        else:
            self.option(record["method"], f"{kind}.method", SETTINGS_OPTIONS["ablation_method"])
            ablated = set(self.heads(record["ablated"], f"{kind}.ablated"))
        self.number(record["clean_loss"], f"{kind}.clean_loss", 0.0)
        self.grid(record["effect"], f"{kind}.effect")
        if kind == "ablation":
            for layer, row in enumerate(record["effect"]):
                for index, cell in enumerate(row):
                    if cell is not None and (layer, index) not in ablated:
                        raise self.fail(f"{kind}.effect[{layer}][{index}]", cell,
                                        f"null (head {layer}.{index} is not in ablation.ablated)")
        self.ranked(record["top"], f"{kind}.top")
        if "ci" in record:
            ci = self.obj(record["ci"], f"{kind}.ci", ("effect",), ())
            self.interval_grid(ci["effect"], f"{kind}.ci.effect")

    def agreement(self, value: Any) -> None:
        agreement = self.obj(value, "agreement", ("n_exact", "spearman", "largest_miss"), ("ci",), nullable=True)
        if agreement is None:
            return
        self.interval(agreement.get("ci"), "agreement.ci", -1.0, 1.0)
        self.integer(agreement["n_exact"], "agreement.n_exact", 0, self.n_layers * self.n_heads)
        self.number(agreement["spearman"], "agreement.spearman", -1.0, 1.0, tolerance=SCORE_TOLERANCE)
        miss = self.obj(agreement["largest_miss"], "agreement.largest_miss", ("head", "exact", "estimate"), (),
                        nullable=True)
        if miss is not None:
            self.head(miss["head"], "agreement.largest_miss.head")
            self.number(miss["exact"], "agreement.largest_miss.exact")
            self.number(miss["estimate"], "agreement.largest_miss.estimate")

    def composition(self, value: Any) -> None:
        for mode, entry in self.obj(value, "composition").items():
            at = f"composition.{mode}"
            self.option(mode, "composition", ("Q", "K", "V"))
            entry = self.obj(entry, at, ("baseline", "top_edges"), ())
            baseline = self.obj(entry["baseline"], f"{at}.baseline", ("mean", "std"), (), nullable=True)
            if baseline is not None:
                self.number(baseline["mean"], f"{at}.baseline.mean", 0.0, 1.0, tolerance=SCORE_TOLERANCE)
                self.number(baseline["std"], f"{at}.baseline.std", 0.0)
            for i, edge in enumerate(self.array(entry["top_edges"], f"{at}.top_edges")):
                e = self.obj(edge, f"{at}.top_edges[{i}]", ("src", "dst", "score"), ())
                self.edge(e["src"], e["dst"], f"{at}.top_edges[{i}]")
                self.number(e["score"], f"{at}.top_edges[{i}].score", 0.0, 1.0, tolerance=SCORE_TOLERANCE)

    def circuit(self, value: Any, search: str = "ranked") -> None:
        """``circuit`` (:func:`circuitkit.report.data.circuit_json`) or null; ``search``: the settings' search (a
        circuit searched beyond ranking holds that search's record, a ranked one none)."""
        required = ("heads", "faithfulness", "necessity", "target", "method", "losses", "curve", "passes",
                    "ranked_by", "roles", "edges")
        circuit = self.obj(value, "circuit", required, ("ci", "random_baseline", "stability", "explanations",
                                                         "evaluation", "search"),
                           nullable=True)
        if circuit is None:
            return
        members = set(self.heads(circuit["heads"], "circuit.heads", non_empty=True))
        self.number(circuit["faithfulness"], "circuit.faithfulness", nullable=False)
        self.number(circuit["necessity"], "circuit.necessity")
        self.number(circuit["target"], "circuit.target", 0.0, 1.0, nullable=False)
        if circuit["target"] <= 0.0:
            raise self.fail("circuit.target", circuit["target"], "a faithfulness target in (0, 1]")
        self.option(circuit["method"], "circuit.method", SETTINGS_OPTIONS["faithfulness_method"])
        losses = self.obj(circuit["losses"], "circuit.losses", ("clean", "all_ablated", "circuit_only"), ())
        for key, loss in losses.items():
            self.number(loss, f"circuit.losses.{key}", 0.0, nullable=False)
        total = self.n_layers * self.n_heads
        curve = self.array(circuit["curve"], "circuit.curve")
        if len(curve) < 2:
            raise self.fail("circuit.curve", curve, "at least 2 points (no head kept, and the circuit)")
        for i, point in enumerate(curve):
            p = self.obj(point, f"circuit.curve[{i}]", ("n_heads", "faithfulness", "loss"), ("ci",))
            self.integer(p["n_heads"], f"circuit.curve[{i}].n_heads", 0, total)
            self.number(p["faithfulness"], f"circuit.curve[{i}].faithfulness", nullable=False)
            self.number(p["loss"], f"circuit.curve[{i}].loss", 0.0, nullable=False)
            self.interval(p.get("ci"), f"circuit.curve[{i}].ci")
        self.integer(circuit["passes"], "circuit.passes", 1, MAX_INT)
        self.option(circuit["ranked_by"], "circuit.ranked_by", ("effect", "joint"))
        for role, heads in self.obj(circuit["roles"], "circuit.roles").items():
            for head in self.heads(heads, f"circuit.roles.{role}"):
                if head not in members:
                    raise self.fail(f"circuit.roles.{role}", heads, "heads of circuit.heads")
        for i, edge in enumerate(self.array(circuit["edges"], "circuit.edges")):
            at = f"circuit.edges[{i}]"
            e = self.obj(edge, at, ("src", "dst", "channel", "effect", "estimate", "composition", "weight_only"),
                         ("ci",))
            self.edge(e["src"], e["dst"], at)
            if self.head(e["src"], f"{at}.src") not in members or self.head(e["dst"], f"{at}.dst") not in members:
                raise self.fail(at, validate.given(f"an edge {e['src']} -> {e['dst']}"), "an edge between two heads "
                                                                                         "of circuit.heads")
            self.option(e["channel"], f"{at}.channel", CHANNELS)
            self.number(e["effect"], f"{at}.effect", nullable=False)
            self.number(e["estimate"], f"{at}.estimate")
            self.number(e["composition"], f"{at}.composition", 0.0, 1.0, tolerance=SCORE_TOLERANCE)
            self.flag(e["weight_only"], f"{at}.weight_only")
            self.interval(e.get("ci"), f"{at}.ci")
        if "explanations" in circuit:
            self.explanations(circuit["explanations"], members)
        if "ci" in circuit:
            ci = self.obj(circuit["ci"], "circuit.ci", (), ("faithfulness", "necessity", "losses"))
            self.interval(ci.get("faithfulness"), "circuit.ci.faithfulness")
            self.interval(ci.get("necessity"), "circuit.ci.necessity")
            self.intervals(ci.get("losses", {}), "circuit.ci.losses")
        self.random_baseline(circuit.get("random_baseline"), len(members))
        self.stability(circuit.get("stability"))
        self.evaluation(circuit.get("evaluation"))
        self.searched(circuit.get("search"), search, circuit)

    def searched(self, value: Any, search: str, circuit: dict[str, Any]) -> None:
        """``circuit.search`` (:meth:`circuitkit.circuits.search.SearchResult.to_json`): present exactly where
        ``settings.search`` is not ``"ranked"``, that search's, its size the circuit's and its faithfulness the
        circuit's; the size it started from a point of the ranked curve."""
        at = "circuit.search"
        if (value is None) != (search == "ranked"):
            raise self.fail(at, value, f"the record of the {search} search (settings.search)" if search != "ranked"
                            else "absent: settings.search is ranked")
        if value is None:
            return
        total = self.n_layers * self.n_heads
        self.search_record(value, at, search, len(circuit["heads"]), circuit["faithfulness"],
                           {point["n_heads"] for point in circuit["curve"]}, total, "circuit.heads", "circuit.curve")

    def search_record(self, value: Any, at: str, search: str, size: int, faithfulness: float, sizes: set[int],
                      total: int, members: str, curve: str) -> None:
        """A :meth:`circuitkit.circuits.search.SearchResult.to_json` record at ``at`` of the search ``search``: its
        ``size`` the circuit's (``size``, the count of ``members``), its ``faithfulness`` the circuit's, the size it
        started from one of the ranked ``curve``'s ``sizes`` (every size at most ``total``), its trace's steps."""
        keys = ("search", "size", "start_size", "faithfulness", "passes", "trace", "settings")
        record = self.obj(value, at, keys, ())
        if record["search"] != search:
            raise self.fail(f"{at}.search", record["search"], f"settings.{at.rsplit('.', 1)[-1]} ({search!r})")
        found = self.integer(record["size"], f"{at}.size", 1, total)
        if found != size:  # checked members by now
            raise self.fail(f"{at}.size", found, f"the number of {members}")
        start = self.integer(record["start_size"], f"{at}.start_size", 1, total)
        if start not in sizes:  # checked integers by now
            raise self.fail(f"{at}.start_size", start, f"a size of {curve} (the ranked circuit it started from)")
        measured = self.number(record["faithfulness"], f"{at}.faithfulness", nullable=False)
        if not math.isclose(measured, faithfulness, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9):
            raise self.fail(f"{at}.faithfulness", measured, "the circuit's faithfulness (the searched set's)")
        self.number(record["passes"], f"{at}.passes", 0.0, nullable=False)
        for i, step in enumerate(self.array(record["trace"], f"{at}.trace")):
            s = self.obj(step, f"{at}.trace[{i}]", ("step", "size", "faithfulness"), ())
            self.text(s["step"], f"{at}.trace[{i}].step", non_empty=True)
            self.integer(s["size"], f"{at}.trace[{i}].size", 0, total)
            self.number(s["faithfulness"], f"{at}.trace[{i}].faithfulness", nullable=False)
        self.obj(record["settings"], f"{at}.settings")

    def evaluation(self, value: Any) -> None:
        """``circuit.evaluation`` (:func:`circuitkit.circuits.heldout.held_out`); absent in files written before it
        was measured. ``faithfulness`` is null exactly where ``note`` says why."""
        at = "circuit.evaluation"
        keys = ("sequences", "seed", "faithfulness", "necessity", "losses", "passes", "note")
        record = self.obj(value, at, keys, keys, nullable=True)
        if record is None:
            return
        self.integer(record["sequences"], f"{at}.sequences", 1, MAX_SIZE)
        self.integer(record["seed"], f"{at}.seed", 0, MAX_INT, nullable=True)
        faithfulness = self.number(record["faithfulness"], f"{at}.faithfulness")
        self.number(record["necessity"], f"{at}.necessity")
        losses = self.obj(record["losses"], f"{at}.losses", ("clean", "all_ablated", "circuit_only"),
                          ("clean", "all_ablated", "circuit_only"))
        for key, loss in losses.items():
            self.number(loss, f"{at}.losses.{key}", 0.0, nullable=False)
        self.integer(record["passes"], f"{at}.passes", 1, MAX_INT)
        note = self.text(record["note"], f"{at}.note", nullable=True, non_empty=True)
        if (faithfulness is None) != (note is not None):
            raise self.fail(f"{at}.note", note, "a reason exactly where faithfulness is null")

    def random_baseline(self, value: Any, size: int) -> None:
        """``circuit.random_baseline`` (:meth:`circuitkit.circuits.baseline.RandomBaseline.to_json`), or null."""
        at = "circuit.random_baseline"
        record = self.obj(value, at, ("size", "n_sets", "seed", "passes", "uniform", "layered"), (), nullable=True)
        if record is None:
            return
        if record["size"] != size or isinstance(record["size"], bool):
            raise self.fail(f"{at}.size", record["size"], f"the circuit's size ({size} heads)")
        n_sets = self.integer(record["n_sets"], f"{at}.n_sets", 2, 10_000)
        self.integer(record["seed"], f"{at}.seed", 0, MAX_INT)
        self.integer(record["passes"], f"{at}.passes", 0, MAX_INT)
        for kind in ("uniform", "layered"):
            sets = self.obj(record[kind], f"{at}.{kind}", ("kind", "mean", "spread", "ci", "faithfulness"), ())
            self.option(sets["kind"], f"{at}.{kind}.kind", (kind,))
            self.number(sets["mean"], f"{at}.{kind}.mean", nullable=False)
            self.interval(sets["spread"], f"{at}.{kind}.spread")
            if sets["spread"] is None:
                raise self.fail(f"{at}.{kind}.spread", None, "an interval [lo, hi]")
            self.interval(sets["ci"], f"{at}.{kind}.ci")
            values = self.array(sets["faithfulness"], f"{at}.{kind}.faithfulness")
            if len(values) != n_sets:
                raise self.fail(f"{at}.{kind}.faithfulness", validate.given(f"{len(values)} values"),
                                f"one per set ({at}.n_sets = {n_sets})")
            for i, v in enumerate(values):
                self.number(v, f"{at}.{kind}.faithfulness[{i}]", nullable=False)

    def stability(self, value: Any) -> None:
        """``circuit.stability`` (:meth:`circuitkit.circuits.stability.Stability.to_json`), or null."""
        at = "circuit.stability"
        record = self.obj(value, at, ("n_resamples", "seed", "jaccard", "stable", "inclusion", "sizes",
                                      "faithfulness", "passes"), (), nullable=True)
        if record is None:
            return
        n = self.integer(record["n_resamples"], f"{at}.n_resamples", 2, 10_000)
        self.integer(record["seed"], f"{at}.seed", 0, MAX_INT)
        jaccard = self.number(record["jaccard"], f"{at}.jaccard", 0.0, 1.0)
        self.flag(record["stable"], f"{at}.stable")
        from circuitkit.circuits.stability import STABLE_JACCARD

        if record["stable"] != (jaccard is not None and jaccard >= STABLE_JACCARD):
            raise self.fail(f"{at}.stable", record["stable"], f"whether jaccard ({jaccard}) is at least "
                                                              f"{STABLE_JACCARD}")
        for head, share in self.obj(record["inclusion"], f"{at}.inclusion").items():
            self.head(head, f"{at}.inclusion")
            self.number(share, f"{at}.inclusion.{head}", 0.0, 1.0, nullable=False)
        for key in ("sizes", "faithfulness"):
            values = self.array(record[key], f"{at}.{key}")
            if len(values) != n:
                raise self.fail(f"{at}.{key}", validate.given(f"{len(values)} values"),
                                f"one per resample ({at}.n_resamples = {n})")
            for i, v in enumerate(values):
                if key == "sizes":
                    self.integer(v, f"{at}.sizes[{i}]", 0, self.n_layers * self.n_heads, nullable=True)
                else:
                    self.number(v, f"{at}.faithfulness[{i}]")
        self.number(record["passes"], f"{at}.passes", 0.0, nullable=False)

    def evidence(self, value: Any, settings: dict[str, Any]) -> None:
        evidence = self.obj(value, "evidence", ("rows",), ("metric", "corrupt", "thresholds"), nullable=True)
        if evidence is None:
            return
        if settings.get("edge_attribution_steps") is None:
            raise self.fail("evidence", validate.given("an edge table"),
                            "null where settings.edge_attribution_steps is null (the scan measured no edges)")
        self.text(evidence.get("metric", "loss"), "evidence.metric", non_empty=True)
        self.text(evidence.get("corrupt", "resample"), "evidence.corrupt", non_empty=True)
        for key, v in self.obj(evidence.get("thresholds", {}), "evidence.thresholds").items():
            self.number(v, f"evidence.thresholds.{key}", nullable=False)
        for i, row in enumerate(self.array(evidence["rows"], "evidence.rows")):
            at = f"evidence.rows[{i}]"
            r = self.obj(row, at, ("src", "dst", "channel"))
            self.edge(r["src"], r["dst"], at)
            self.option(r["channel"], f"{at}.channel", CHANNELS)
            for key in ("weight_only", "effect_only"):
                self.flag(r.get(key, False), f"{at}.{key}")
            self.text(r.get("name", ""), f"{at}.name")
            for key, v in r.items():
                if key not in EVIDENCE_KEYS:
                    lo, hi = (0.0, 1.0) if key == "composition" else (-math.inf, math.inf)
                    self.number(v, f"{at}.{key}", lo, hi, tolerance=SCORE_TOLERANCE if key == "composition" else 0)

    def uncertainty(self, data: dict[str, Any], scores: dict[str, str]) -> None:
        from circuitkit.uncertainty import MAX_RESAMPLES

        if "uncertainty" in data:
            u = self.obj(data["uncertainty"], "uncertainty", ("method", "n_resamples", "level", "seed",
                                                              "extra_passes"), ())
            self.text(u["method"], "uncertainty.method")
            self.integer(u["n_resamples"], "uncertainty.n_resamples", 2, MAX_RESAMPLES)
            self.level(u["level"], "uncertainty.level")
            self.integer(u["seed"], "uncertainty.seed", 0, MAX_INT)
            self.integer(u["extra_passes"], "uncertainty.extra_passes", 0, MAX_INT)
        for name, value in self.obj(data.get("head_scores_ci", {}), "head_scores_ci").items():
            if name not in scores:
                raise self.fail(f"head_scores_ci.{name}", value, f"intervals of a computed score ({sorted(scores)})")
            self.interval_grid(value, f"head_scores_ci.{name}")
        for label, value in self.obj(data.get("circuit_ablation_ci", {}), "circuit_ablation_ci").items():
            self.interval(value, f"circuit_ablation_ci.{label}")


def _all_plain(data: Any) -> bool:
    """Whether every number in ``data`` is finite and within int64 (one pass without paths: the common case)."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            return False
    return True


def _numbers(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every number in a parsed JSON value, with its path (``a.b[2]``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}[{i}]")
    elif isinstance(value, (int, float)):
        yield path, value


def check_scores_json(data: dict[str, Any], where: str) -> None:
    """Refuse ``data`` (a parsed ``scores.json`` of the current format) unless a computed scan could have written
    it (the module docstring lists the rules); ``where`` names the file in the error."""
    ScoresCheck(data, where).run()


def first_difference(saved: Any, written: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first place where ``saved`` (the file) and ``written`` (the loaded scan written again) disagree, as
    ``(path, saved value, written value)``; None where they agree (numbers to :data:`RELATIVE_TOLERANCE`)."""
    if isinstance(saved, dict) and isinstance(written, dict):
        for key in list(saved) + [k for k in written if k not in saved]:
            if key not in saved or key not in written:
                return (f"{path}.{key}" if path else key, saved.get(key), written.get(key))
            found = first_difference(saved[key], written[key], f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(saved, list) and isinstance(written, list):
        if len(saved) != len(written):
            return path, saved, written
        for i, (a, b) in enumerate(zip(saved, written, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    numbers = (int, float)
    if (isinstance(saved, numbers) and isinstance(written, numbers) and not isinstance(saved, bool)
            and not isinstance(written, bool)):
        same = math.isclose(saved, written, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)
        return None if same else (path, saved, written)
    if type(saved) is not type(written) or saved != written:
        return path, saved, written
    return None
