"""The fuzz table: every public callable of circuitkit, a valid call of it, and the kind of each argument.

Why a table: the promise "every bad input raises ``CircuitkitError``" is only as good as the inputs tried. Each
entry of :data:`CASES` names a callable (``module:name`` or ``module:Class.method``), builds a valid set of keyword
arguments, and gives each argument a *kind*; :data:`KINDS` turns a kind and the argument's valid value into
bad values (wrong types, out-of-range ints, NaN/inf, wrong rank/shape/dtype, NaN/inf/huge weights, empty tensors,
out-of-vocabulary tokens, models without attention, devices that do not exist, unknown options).

A bad value is *strict* (the call must raise ``CircuitkitError``) or *lenient* (the input is legal but hostile:
huge finite weights, numpy arrays, half precision; the call must raise ``CircuitkitError`` or return a finite
result). Objects that circuitkit builds and returns (result records) are listed in :data:`RECORDS` with the
reason they are not fuzzed; :func:`public_callables` lists what must be covered by one or the other.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.conftest import random_weights


@cache
def _scratch_root() -> Path:
    """One temporary folder for every file the cases write, removed when the test process exits."""
    import atexit
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="circuitkit-fuzz-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _scratch() -> Path:
    """A fresh folder inside :func:`_scratch_root`."""
    import tempfile

    return Path(tempfile.mkdtemp(dir=_scratch_root()))

# ---------------------------------------------------------------------------------------------------- packages

PACKAGES = (
    "circuitkit",
    "circuitkit.detect",
    "circuitkit.models",
    "circuitkit.handbuilt",
    "circuitkit.viz",
    "circuitkit.theory",
    "circuitkit.circuits",
    "circuitkit.validate",
    "circuitkit.tracking",
    "circuitkit.tasks",
)
ZOO = "circuitkit.zoo"
ZOO_PUBLIC = ("available", "curve", "info", "load", "native_config")
"""``circuitkit.zoo`` has no ``__all__``; these are its public functions (the rest of its namespace is imports)."""
REPORT = "circuitkit.report"
REPORT_PUBLIC = ("save", "scan_json", "build_report", "summary_html")

METHODS = (
    "circuitkit.weights:HeadWeights.from_tensors",
    "circuitkit.weights:HeadWeights.from_model",
    "circuitkit.weights:HeadWeights.to",
    "circuitkit.weights:HeadWeights.layers",
    "circuitkit.weights:HeadWeights.per_query_head",
    "circuitkit.detect.scores:HeadScores.top",
    "circuitkit.detect.scores:HeadScores.patterns_for",
    "circuitkit.detect.scores:HeadScores.to_dataframe",
    "circuitkit.scan_types:HeadEffects.top",
    "circuitkit.scan_types:Scan.top",
    "circuitkit.scan_types:Scan.save",
    "circuitkit.scan_types:Scan.load",
    "circuitkit.scan_types:Scan.table",
    "circuitkit.scan_types:Scan.to_pandas",
    "circuitkit.tracking.result:Track.chart",
    "circuitkit.detect.tokens:RepeatedTokens.build",
    "circuitkit.detect.tokens:TokenBatch.targets",
    "circuitkit.models.toy:AttentionOnlyModel.run_with_hooks",
    "circuitkit.models.toy:AttentionOnlyModel.run_with_cache",
    "circuitkit.models.toy:AttentionOnlyModel.forward",
    "circuitkit.models.toy:AttentionOnlyModel.with_attention",
    "circuitkit.models.toy:AttentionOnlyModel.to",
    "circuitkit.handbuilt.subspace:ResidualLayout.stack",
    "circuitkit.handbuilt.subspace:Subspace.span",
    # operators and reads of the hand-building API (a bad operand is a user's argument like any other)
    "circuitkit.factored:Factored.__matmul__",
    "circuitkit.factored:Factored.__rmatmul__",
    "circuitkit.factored:Factored.__getitem__",
    "circuitkit.handbuilt.heads:QK.__add__",
    "circuitkit.handbuilt.heads:OV.__add__",
    "circuitkit.handbuilt.subspace:Subspace.__getitem__",
    "circuitkit.handbuilt.subspace:Subspace.__add__",
    "circuitkit.handbuilt.subspace:Subspace.read",
    "circuitkit.handbuilt.exercises:VirtualHeadExercise.paths",
    "circuitkit.tracking.result:Track.load",
    "circuitkit.graph.task:Task.from_pairs",
    "circuitkit.graph.task:Task.tokenize",
    "circuitkit.tasks.scan:TaskScan.save",
    "circuitkit.tasks.scan:TaskScan.load",
    "circuitkit.tasks.scan:TaskScan.table",
    "circuitkit.tasks.scan:TaskScan.to_pandas",
    "circuitkit.tasks.scan:TaskScan.searched",
    "circuitkit.tasks.scan:TaskScan.top",
    "circuitkit.circuits.record:CircuitRecord.interval",
)
"""Methods fuzzed besides the packages' exports: the ones a user calls with arguments of their own."""


def _public_names(module: str) -> list[str]:
    mod = importlib.import_module(module)
    if module == ZOO:
        return list(ZOO_PUBLIC)
    if module == REPORT:
        return list(REPORT_PUBLIC)
    return list(mod.__all__)


def public_callables() -> dict[str, Any]:
    """``"module:name" -> object`` for every callable exported (classes included), plus :data:`METHODS`. A name
    re-exported by several packages appears under each; one entry in the table covers them all."""
    found: dict[str, Any] = {}
    for module in (*PACKAGES, ZOO, REPORT):
        mod = importlib.import_module(module)
        for name in _public_names(module):
            obj = getattr(mod, name)
            if not inspect.ismodule(obj) and callable(obj):
                found[f"{module}:{name}"] = obj
    for key in METHODS:
        found[key] = resolve(key)
    return found


def resolve(key: str) -> Any:
    module, _, attr = key.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------------- fixtures
# Tiny models, built once per process. The toy model: 2 layers x 2 heads, d_model 8, d_head 4, vocab 16, n_ctx 32.

D_VOCAB = 16
N_CTX = 32


@cache
def weights():
    w = random_weights(2, 2, 8, 4, d_vocab=D_VOCAB, seed=0)
    g = torch.Generator().manual_seed(1)
    return replace(w, W_pos=torch.randn(N_CTX, 8, generator=g) / 8**0.5)


@cache
def toy():
    from circuitkit.models import AttentionOnlyModel

    return AttentionOnlyModel(weights())


@cache
def bridge():
    """The bundled 2-layer model (a TransformerLens ``TransformerBridge``; loads in well under a second)."""
    from circuitkit import zoo

    return zoo.load()


def spec():
    from circuitkit import RepeatedTokens

    return RepeatedTokens(block_len=4, batch=2)


@cache
def batch():
    return spec().build(toy())


@cache
def head_scores_result():
    import circuitkit as ck

    return ck.head_scores(toy(), spec())


@cache
def effects():
    import circuitkit as ck

    return ck.ablation_effects(toy(), spec())


@cache
def attribution():
    import circuitkit as ck

    return ck.attribution_effects(toy(), spec())


@cache
def scan():
    from tests.report_fixtures import synthetic_scan

    return synthetic_scan(2, 4)


@cache
def saved_scan_dir() -> str:
    """A synthetic scan saved once (report.html + scores.json), for Scan.load."""
    out = tmp_out_dir()
    scan().save(out)
    return out


def comp_scores():
    import circuitkit as ck

    return ck.composition_scores(weights(), "K")


def scaled(w, factor: float, names=("W_Q", "W_K", "W_V", "W_O")):
    return replace(w, **{n: getattr(w, n) * factor for n in names})


def toy_from(w, **kwargs):
    from circuitkit.models import AttentionOnlyModel

    return AttentionOnlyModel(w, **kwargs)


class CfgOnly:
    """Has a TransformerLens-like ``cfg`` but no hooks and no weights."""

    class cfg:  # noqa: N801 - mimics model.cfg
        n_layers, n_heads, d_model, d_head, d_vocab, n_ctx = 2, 2, 8, 4, D_VOCAB, N_CTX


class DuckWeights:
    """Duck-typed model with weights in TransformerLens shapes, poisoned with ``value``."""

    def __init__(self, value: float) -> None:
        w = weights()
        self.cfg = CfgOnly.cfg
        self.W_Q = w.W_Q.clone()
        self.W_Q[0, 0, 0, 0] = value
        self.W_K, self.W_V, self.W_O, self.W_E, self.W_U = w.W_K, w.W_V, w.W_O, w.W_E, w.W_U


def mlp_only():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))


def token_batch(ids):
    from circuitkit.detect import TokenBatch

    b = batch()
    return TokenBatch(tokens=ids, block_len=b.block_len, n_repeats=b.n_repeats, bos=b.bos)


# ---------------------------------------------------------------------------------------------------- kinds
# A bad value: (label, make(valid) -> value, strict). ``make`` runs inside the checked call, so a bad value whose
# construction is itself refused with CircuitkitError counts as refused.

STRICT, LENIENT = True, False
Bad = tuple[str, Callable[[Any], Any], bool]


def const(value):
    return lambda valid: value


NO_CUDA = not torch.cuda.is_available()

WRONG_TYPES: list[Bad] = [
    ("str", const("2"), STRICT),
    ("bytes", const(b"2"), STRICT),
    ("None", const(None), STRICT),
    ("list", const([2]), STRICT),
    ("dict", const({}), STRICT),
    ("object", const(object()), STRICT),
]


def _ints(minimum: int, *, optional: bool = False, huge_strict: bool = False) -> list[Bad]:
    bad = [b for b in WRONG_TYPES if not (optional and b[0] == "None")]
    bad += [
        ("bool", const(True), STRICT),
        ("float-1.5", const(1.5), STRICT),
        ("float-2.0", const(2.0), STRICT),
        ("np.float64", const(np.float64(2.0)), STRICT),
        ("nan", const(math.nan), STRICT),
        ("inf", const(math.inf), STRICT),
        ("float-tensor", const(torch.tensor(2.5)), STRICT),
        ("2**70", const(2**70), huge_strict),
    ]
    for value in (0, -1, -(2**70)):
        if value < minimum:
            bad.append((f"int{value}" if value > -100 else "-2**70", const(value), STRICT))
    return bad


def _reals(*, minimum: float | None = None, strict_minimum: bool = False, optional: bool = False) -> list[Bad]:
    bad = [b for b in WRONG_TYPES if not (optional and b[0] == "None")]
    bad += [
        ("bool", const(True), STRICT),
        ("complex", const(1j), STRICT),
        ("nan", const(math.nan), STRICT),
        ("np.nan", const(np.float32("nan")), STRICT),
        ("inf", const(math.inf), STRICT),
        ("-inf", const(-math.inf), STRICT),
        ("tensor-nan", const(torch.tensor(math.nan)), STRICT),
        ("int-10**400", const(10**400), STRICT),  # an int beyond float64: float() raises OverflowError
    ]
    if minimum is not None:
        bad.append(("below-minimum", const(minimum - 1.0), STRICT))
        if strict_minimum:
            bad.append(("at-minimum", const(float(minimum)), STRICT))
    return bad


BOOLS: list[Bad] = [
    ("str-yes", const("yes"), STRICT),
    ("str-False", const("False"), STRICT),
    ("int-1", const(1), STRICT),
    ("int-0", const(0), STRICT),
    ("None", const(None), STRICT),
    ("list", const([True]), STRICT),
    ("np.bool_", const(np.bool_(True)), LENIENT),
]


def _options(optional: bool = False) -> list[Bad]:
    bad = [
        ("unknown", const("nonsense"), STRICT),
        ("empty", const(""), STRICT),
        ("int", const(3), STRICT),
        ("list", lambda v: [v], STRICT),
        ("bytes", lambda v: v.encode() if isinstance(v, str) else b"x", STRICT),
        ("padded", lambda v: f" {v} ", STRICT),
        ("object", const(object()), STRICT),
    ]
    if not optional:
        bad.append(("None", const(None), STRICT))
    return bad


DEVICES: list[Bad] = [
    ("nonsense", const("nonsense"), STRICT),
    ("meta", const("meta"), STRICT),
    ("torch.device-meta", const(torch.device("meta")), STRICT),
    ("int-3", const(3), STRICT),
    ("bool", const(True), STRICT),
    ("bytes", const(b"cpu"), STRICT),
    ("cuda:99", const("cuda:99"), STRICT),
    ("list", const(["cpu"]), STRICT),
    *([("cuda-without-gpu", const("cuda"), STRICT)] if NO_CUDA else []),
]


def _tensors(*, optional: bool = False, rank: bool = True, empty: bool = True, numpy_ok: bool = True,
             dtype_strict: bool = True) -> list[Bad]:
    """Bad variants of a valid floating tensor."""
    bad = [b for b in WRONG_TYPES if b[0] in ("str", "bytes", "dict", "object") or (b[0] == "None" and not optional)]
    bad += [
        ("scalar-int", const(3), STRICT),
        ("list-of-str", lambda v: [["a", "b"]], STRICT),
        ("int-dtype", lambda v: v.round().long(), dtype_strict),
        ("bool-dtype", lambda v: v > 0, dtype_strict),
        ("complex-dtype", lambda v: v.to(torch.complex64), dtype_strict),
        ("nan", lambda v: _poison(v, math.nan), STRICT),
        ("inf", lambda v: _poison(v, math.inf), STRICT),
        ("-inf", lambda v: _poison(v, -math.inf), STRICT),
        ("huge-x1e10", lambda v: v * 1e10, LENIENT),
        ("huge-x1e30", lambda v: v * 1e30, LENIENT),
        ("tiny-x1e-30", lambda v: v * 1e-30, LENIENT),
        ("float32-max", lambda v: torch.where(v < 0, -3e38, 3e38).to(v.dtype) if v.is_floating_point() else v,
         LENIENT),  # finite, but any sum or product overflows float32
        ("float64-x1e160", lambda v: v.double() * 1e160, LENIENT),  # a square overflows float64
        ("half", lambda v: v.half(), LENIENT),
        ("float64", lambda v: v.double(), LENIENT),
        ("non-contiguous", lambda v: v.transpose(-1, -2).contiguous().transpose(-1, -2) if v.ndim >= 2 else v,
         LENIENT),
        ("numpy", lambda v: v.numpy(), LENIENT if numpy_ok else STRICT),
    ]
    if rank:
        bad += [
            ("rank-plus-1", lambda v: v[None, None] if v.ndim == 0 else v.unsqueeze(0).expand(2, *v.shape), STRICT),
            ("rank-minus-1", lambda v: v.reshape(-1)[:3] if v.ndim <= 1 else v[0], STRICT),
            ("scalar-tensor", lambda v: v.reshape(-1)[0], STRICT),
        ]
    if empty:
        bad.append(("empty", lambda v: v[..., :0] if v.ndim else torch.empty(0), STRICT))
    return bad


def _via_torch(make):
    """A numpy version of a torch bad-value maker: numpy in, numpy out (other results as they are)."""

    def go(valid):
        out = make(torch.from_numpy(valid))
        return out.numpy() if isinstance(out, torch.Tensor) and out.dtype != torch.bfloat16 else out

    return go


def _poison(v, value):
    v = v.detach().clone()
    v.view(-1)[0] = value
    return v


def _token_ids() -> list[Bad]:
    """Bad variants of a valid ``[..., pos]`` long tensor of token ids (vocabulary :data:`D_VOCAB`)."""
    return [
        ("None", const(None), STRICT),
        ("str", const("t1 t2"), STRICT),
        ("list-of-str", const([["a"]]), STRICT),
        ("float-dtype", lambda v: v.float(), STRICT),
        ("bool-dtype", lambda v: v > 0, STRICT),
        ("out-of-vocab", lambda v: v + 1000, STRICT),
        ("negative", lambda v: v - 100, STRICT),
        ("2**40", lambda v: torch.full_like(v, 2**40), STRICT),
        ("empty", lambda v: v[..., :0], STRICT),
        ("rank-3", lambda v: v[None, None] if v.ndim == 1 else v[None], STRICT),
        ("too-long", lambda v: v.repeat_interleave(20, dim=-1), STRICT),
        ("meta", lambda v: v.to("meta"), STRICT),
        ("int8-dtype", lambda v: v.to(torch.int8), LENIENT),  # valid ids in a small integer dtype
        ("uint8-dtype", lambda v: v.to(torch.uint8), LENIENT),  # torch indexes with a uint8 tensor as a mask
    ]


MODELS_COMMON: list[Bad] = [
    ("None", const(None), STRICT),
    ("int", const(3), STRICT),
    ("tensor", const(torch.zeros(3)), STRICT),
    ("dict", const({}), STRICT),
    ("cfg-no-hooks", const(CfgOnly()), STRICT),
    ("mlp-only-module", lambda v: mlp_only(), STRICT),
    ("duck-nan-weights", lambda v: DuckWeights(math.nan), STRICT),
    ("duck-inf-weights", lambda v: DuckWeights(math.inf), STRICT),
    ("missing-dir", const("/nonexistent/circuitkit-fuzz-model"), STRICT),
    ("module-nan-weight", lambda v: module_with(math.nan), STRICT),
    ("module-inf-weight", lambda v: module_with(math.inf), STRICT),
]


@cache
def module_with(value: float):
    """The bundled model (a torch module) with one attention weight poisoned: refused naming the parameter (before
    any work, so one copy per value serves every call)."""
    from circuitkit import zoo

    model = zoo.load()
    name = next(n for n, _ in model.named_parameters() if n.endswith("k._original_component.weight"))
    with torch.no_grad():
        model.get_parameter(name).view(-1)[0] = value
    return model


@cache
def half_bridge(dtype=torch.bfloat16):
    """The bundled model in half precision (every entry point gives it back as it was: one copy serves all)."""
    from circuitkit import zoo

    return zoo.load().to(dtype)


def _models(*, needs_unembed: bool = False, optional: bool = False, runs: bool = True) -> list[Bad]:
    """Bad models. ``runs``: the callable runs the model (so a toy model with huge Q/K weights is tried)."""
    bad = [b for b in MODELS_COMMON if not (optional and b[0] == "None")]
    bad += [
        ("head-weights-only", lambda v: weights(), LENIENT),
        ("no-unembed", lambda v: toy_from(replace(weights(), W_U=None)), STRICT if needs_unembed else LENIENT),
        ("no-embed", lambda v: toy_from(replace(weights(), W_E=None, W_pos=None)), LENIENT),
    ]
    if runs:
        bad += [
            ("bridge-bfloat16", lambda v: half_bridge(torch.bfloat16), LENIENT),
            ("bridge-float16", lambda v: half_bridge(torch.float16), LENIENT),
            ("huge-qk-x1e10", lambda v: toy_from(scaled(weights(), 1e10, ("W_Q", "W_K"))), LENIENT),
            ("huge-all-x1e30", lambda v: toy_from(scaled(weights(), 1e30)), LENIENT),
            ("hard-attention", lambda v: toy_from(weights(), attention="hard"), LENIENT),
        ]
    return bad


def _weights_arg() -> list[Bad]:
    """Bad values for an argument taking HeadWeights or a model to read them from."""
    bad = [b for b in MODELS_COMMON if b[0] != "missing-dir"]
    bad += [
        ("str", const("gpt2"), STRICT),
        ("huge-x1e10", lambda v: scaled(weights(), 1e10), LENIENT),
        ("huge-x1e30", lambda v: scaled(weights(), 1e30), LENIENT),
        ("tiny-x1e-30", lambda v: scaled(weights(), 1e-30), LENIENT),
        ("half", lambda v: weights().to(dtype=torch.float16), LENIENT),
        ("zero-weights", lambda v: scaled(weights(), 0.0), LENIENT),
        ("toy-model", lambda v: toy(), LENIENT),
    ]
    return bad


def _tokens_arg() -> list[Bad]:
    """Bad values for ``tokens: RepeatedTokens | TokenBatch | None``."""
    from circuitkit import RepeatedTokens

    return [
        ("str", const("t1 t2 t3"), STRICT),
        ("int", const(3), STRICT),
        ("dict", const({}), STRICT),
        ("nested-list", const([[1, 2, 3, 1, 2, 3]]), STRICT),
        ("float-tensor", lambda v: batch().tokens.float(), STRICT),
        ("raw-id-tensor", lambda v: batch().tokens, LENIENT),
        ("batch-out-of-vocab", lambda v: token_batch(batch().tokens + 1000), STRICT),
        ("batch-negative", lambda v: token_batch(batch().tokens - 100), STRICT),
        ("batch-float-ids", lambda v: token_batch(batch().tokens.float()), STRICT),
        ("batch-rank-1", lambda v: token_batch(batch().tokens[0]), STRICT),
        ("batch-too-short", lambda v: token_batch(batch().tokens[:, :3]), STRICT),
        ("batch-empty", lambda v: token_batch(batch().tokens[:0]), STRICT),
        ("spec-longer-than-context", lambda v: RepeatedTokens(block_len=500, batch=2), STRICT),
        ("spec-range-out-of-vocab", lambda v: RepeatedTokens(block_len=4, batch=2, token_range=(0, 10**6)), STRICT),
        ("spec-bos-out-of-vocab", lambda v: RepeatedTokens(block_len=4, batch=2, bos=10**6), STRICT),
    ]


HEAD_LISTS: list[Bad] = [
    ("str", const("0.0"), STRICT),
    ("int", const(3), STRICT),
    ("layer-out-of-range", const([(99, 0)]), STRICT),
    ("head-out-of-range", const([(0, 99)]), STRICT),
    ("negative", const([(-1, 0)]), STRICT),
    ("float-index", const([(0.5, 0)]), STRICT),
    ("bool-index", const([(True, 0)]), STRICT),
    ("str-index", const([("0", "0")]), STRICT),
    ("short-tuple", const([(0,)]), STRICT),
    ("long-tuple", const([(0, 0, 0)]), STRICT),
    ("2**70", const([(2**70, 0)]), STRICT),
]

def _endless_count(valid):
    return ((i % 2, i % 2) for i in itertools.count())  # a Python generator: the call-time alarm can stop it


def _endless_cycle(valid):
    return (head for head in itertools.cycle([(0, 0)]))


def _raising(valid):
    yield (0, 0)
    raise RuntimeError("the caller's iterator failed")


ENDLESS: list[Bad] = [
    ("endless-count", _endless_count, STRICT),
    ("endless-cycle", _endless_cycle, STRICT),
    ("raising-iterator", _raising, STRICT),
]
"""Iterators a user may pass where a list is expected: read with a bound (L x H heads), never for ever."""
ENDLESS_INTS: list[Bad] = [
    ("endless-ints", lambda v: (i % 2 for i in itertools.count()), STRICT),
    ("endless-zeros", lambda v: (i for i in itertools.cycle([0])), STRICT),
]
"""The same for arguments that take a list of ints (layers, a token range)."""
HEAD_LISTS += ENDLESS

HEADS: list[Bad] = [(label, (lambda m: lambda v: m(v)[0])(make), s) for label, make, s in HEAD_LISTS
                    if label not in ("str", "int") and (label, make, s) not in ENDLESS]
HEADS += [("str", const("0.0"), STRICT), ("None", const(None), STRICT)]

CALLABLES: list[Bad] = [
    ("int", const(3), STRICT),
    ("str", const("not a function"), STRICT),
    ("None", const(None), STRICT),
]

TEXT: list[Bad] = [
    ("None", const(None), STRICT),
    ("int", const(3), STRICT),
    ("bytes", const(b"x"), STRICT),
    ("list", const(["x"]), STRICT),
]

SCANS: list[Bad] = [
    ("None", const(None), STRICT),
    ("str", const("scan"), STRICT),
    ("dict", const({}), STRICT),
    ("head-scores", lambda v: head_scores_result(), STRICT),
    ("object", const(object()), STRICT),
]

OUT_DIRS: list[Bad] = [
    ("empty-str", const(""), STRICT),
    ("None", const(None), STRICT),
    ("int", const(3), STRICT),
    ("bytes-nul", const(b"a\0b"), STRICT),
    ("nul-in-path", const("fuzz\0dir"), STRICT),
    ("existing-file", lambda v: _existing_file(v), STRICT),
    ("under-a-file", lambda v: str(Path(_existing_file(v)) / "sub"), STRICT),
]


def _existing_file(valid) -> str:
    """A plain file in a fresh temporary directory (never beside ``valid``, which may be inside the package)."""

    path = _scratch() / "a-file"
    path.write_text("not a directory")
    return str(path)


ZOO_NAMES: list[Bad] = [
    ("unknown", const("no-such-model"), STRICT),
    ("empty", const(""), STRICT),
    ("None", const(None), STRICT),
    ("int", const(3), STRICT),
    ("bytes", const(b"induction-2l"), STRICT),
    ("path-escape", const("../zoo"), STRICT),
    ("absolute", const("/etc"), STRICT),
    ("hub-name", const("gpt2"), STRICT),
]

# --- track files and checkpoint names
@cache
def track_directory() -> str:
    """A finished track of two toy checkpoints (two records, track.json, report.html), written once."""
    import circuitkit as ck

    out = tmp_out_dir()
    ck.track([toy(), toy()], steps=[0, 100], tokens=spec(), top_k=2, out=out, progress=False)
    return out


@cache
def checkpoint_directory() -> str:
    """A copy of the bundled model's directory named like a checkpoint."""
    import shutil

    from circuitkit import zoo

    target = _scratch() / "step100"
    shutil.copytree(zoo.info().path, target)
    return str(target)


def _scan_directory() -> str:
    out = Path(tmp_out_dir())
    out.mkdir(parents=True)
    (out / "scores.json").write_text("{}")
    return str(out)


def _broken_track(change) -> Callable[[Any], str]:
    """A copy of :func:`track_directory` with ``change(directory)`` applied."""

    def make(valid):
        import shutil

        out = Path(tmp_out_dir())
        shutil.copytree(track_directory(), out)
        change(out)
        return str(out)

    return make


def _edit_json(name: str, edit) -> Callable[[Path], None]:
    def change(out: Path) -> None:
        import json

        data = json.loads((out / name).read_text())
        edit(data)
        (out / name).write_text(json.dumps(data))

    return change


def _replace_file(name: str, make) -> Callable[[Path], None]:
    def change(out: Path) -> None:
        (out / name).unlink()
        make(out / name)

    return change


def _for_both(edit) -> Callable[[Path], None]:
    """Apply a record edit to the step-100 record and to track.json's entry, so merge and load both see it."""

    def change(out: Path) -> None:
        _edit_json("track-step100.json", edit)(out)
        _edit_json("track.json", lambda d: edit(d["checkpoints"][1]))(out)

    return change


TRACK_DIRS: list[Bad] = [
    *[(f"record-without-{key}", _broken_track(_for_both(lambda d, k=key: d.pop(k))), STRICT)
      for key in ("step", "label", "icl_score", "called", "scores")],
    *[(f"step-{label}", _broken_track(_for_both(lambda d, s=step: d.update(step=s))), STRICT)
      for label, step in (("text", "abc"), ("null", None), ("true", True), ("negative", -5), ("float", 10.7))],
    ("nan-token", _broken_track(lambda out: [(out / n).write_text((out / n).read_text().replace(
        '"icl_score": ', '"icl_score": NaN, "x": ', 1)) for n in ("track-step100.json", "track.json")]), STRICT),
    ("grid-short", _broken_track(_for_both(lambda d: d["scores"]["induction"].pop())), STRICT),
    ("head-out-of-range", _broken_track(_for_both(lambda d: d["called"].update(induction=["9.9"]))), STRICT),
    ("deep-json", _broken_track(lambda out: [(out / n).write_text("[" * 200_000 + "]" * 200_000)
                                             for n in ("track-step100.json", "track.json")]), STRICT),
    ("huge-file", _broken_track(lambda out: [os.truncate(out / n, 600 * 2**20)
                                             for n in ("track-step100.json", "track.json")]), STRICT),
    ("dev-zero", _broken_track(lambda out: [_replace_file(n, lambda p: p.symlink_to("/dev/zero"))(out)
                                            for n in ("track-step100.json", "track.json")]), STRICT),
    ("fifo", _broken_track(lambda out: [_replace_file(n, os.mkfifo)(out)
                                        for n in ("track-step100.json", "track.json")]), STRICT),
    ("duplicate-step", _broken_track(lambda out: (
        __import__("shutil").copy(out / "track-step100.json", out / "track-step0100.json"),
        _edit_json("track.json", lambda d: d["checkpoints"][0].update(step=100))(out))), STRICT),
    ("score-missing", _broken_track(lambda out: (
        _edit_json("track-step100.json", lambda d: d["scores"].pop("duplicate_token"))(out),
        _edit_json("track.json", lambda d: d.update(checkpoints=[]))(out))), STRICT),
    ("other-family", _broken_track(lambda out: (
        _edit_json("track-step100.json", lambda d: d["model"].update(family="GPT-NeoX"))(out),
        _edit_json("track.json", lambda d: d.pop("model"))(out))), STRICT),
    ("not-a-directory", const("/nonexistent/circuitkit-fuzz-track"), STRICT),
    ("int", const(3), STRICT),
    ("None", const(None), STRICT),
]

CHECKPOINT_NAMES: list[Bad] = [
    ("name-300", const("org/" + "a" * 300), STRICT),
    ("step-4301-digits", const("EleutherAI/pythia-70m@step" + "1" * 4301), STRICT),
    ("revision-newline", const("EleutherAI/pythia-70m@step1\nstep2"), STRICT),
    ("revision-dotdot", const("someone/tiny@../../../etc"), STRICT),
    ("nul", const("step1\0"), STRICT),
    ("blank", const("   "), STRICT),
    ("int", const(3), STRICT),
]


DTYPES: list[Bad] = [
    ("str", const("float32"), STRICT),
    ("int", const(3), STRICT),
    ("int64", const(torch.int64), STRICT),
    ("bool", const(torch.bool), STRICT),
    ("complex64", const(torch.complex64), STRICT),
    ("numpy-dtype", const(np.float32), STRICT),
]


def _subspaces() -> list[Bad]:
    from circuitkit.handbuilt import Subspace

    return [
        ("None", const(None), STRICT),
        ("str", const("tok"), STRICT),
        ("int", const(3), STRICT),
        ("tuple", const((0, 1)), STRICT),
        ("other-d_model", lambda v: Subspace(v.name, v.dims, v.d_model + 5), STRICT),
    ]


def _kind(kind: str) -> list[Bad]:
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if base.startswith("int>="):
        return _ints(int(base[5:]), optional=optional)
    if base.startswith("size>="):  # an int that sizes an allocation: 2**70 must be refused
        return _ints(int(base[6:]), optional=optional, huge_strict=True)
    if base == "seed":
        return _ints(0, huge_strict=True)
    if base == "real":
        return _reals(optional=optional)
    if base == "real>0":
        return _reals(minimum=0.0, strict_minimum=True, optional=optional)
    if base == "real>=0":
        return _reals(minimum=0.0, optional=optional)
    simple = {
        "bool": BOOLS,
        "device": DEVICES,
        "heads": HEAD_LISTS,
        "head": HEADS,
        "callable": CALLABLES,
        "text": TEXT,
        "scan": SCANS,
        "out_dir": OUT_DIRS,
        "zoo_name": ZOO_NAMES,
        "dtype": DTYPES,
        "track_dir": TRACK_DIRS,
        "checkpoint_name": CHECKPOINT_NAMES,
    }
    if base in simple:
        bad = simple[base]
    elif base == "option":
        bad = _options(optional)
    elif base == "tensor":
        bad = _tensors(optional=optional)
    elif base == "np":
        bad = [(label, _via_torch(make), strict) for label, make, strict in _tensors(rank=False)
               if label != "numpy"] + [("torch-tensor", lambda v: torch.from_numpy(v), LENIENT)]
    elif base == "tensor-any-rank":
        bad = _tensors(optional=optional, rank=False)
    elif base == "token_ids":
        bad = _token_ids()
    elif base == "token_ids-novocab":  # no model, so no vocabulary to be outside of
        bad = [b for b in _token_ids() if b[0] not in ("out-of-vocab", "2**40", "too-long")]
    elif base == "model":
        bad = _models()
    elif base == "model-loss":
        bad = _models(needs_unembed=True)
    elif base == "model-static":
        bad = _models(runs=False)
    elif base == "weights":
        bad = _weights_arg()
    elif base == "tokens":
        bad = _tokens_arg()
    elif base == "subspace":
        bad = _subspaces()
    else:
        raise KeyError(f"unknown argument kind {kind!r}")
    if optional:
        bad = [b for b in bad if b[0] != "None"]
    return bad


KINDS = _kind


# ---------------------------------------------------------------------------------------------------- the table


@dataclass
class Case:
    """A callable, its valid keyword arguments (built lazily) and the kind of each fuzzed argument."""

    key: str
    valid: Callable[[], dict[str, Any]]
    kinds: dict[str, str]
    positional: tuple[str, ...] = ()
    extra_bad: dict[str, list[Bad]] = field(default_factory=dict)
    target: Callable[[], Callable[..., Any]] | None = None
    run_valid: bool = True
    context: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """argument -> changes to the valid call while that argument's bad values are thrown (``scan``'s ``task``
    needs ``tokens=None``, or every bad task would be refused for the tokens alone)."""

    def valid_for(self, *args: str) -> dict[str, Any]:
        """The valid keyword arguments, with the :attr:`context` of each of ``args`` applied."""
        kwargs = self.valid()
        for arg in args:
            if arg in self.context:
                kwargs.update(self.context[arg]())
        return kwargs

    def function(self) -> Callable[..., Any]:
        return self.target() if self.target is not None else resolve(self.key)

    def call(self, kwargs: dict[str, Any]) -> Any:
        kwargs = dict(kwargs)
        args = [kwargs.pop(name) for name in self.positional]
        return self.function()(*args, **kwargs)

    def bad_values(self) -> list[tuple[str, str, Callable[[Any], Any], bool]]:
        out = []
        for arg, kind in self.kinds.items():
            for label, make, strict in [*_kind(kind), *self.extra_bad.get(arg, [])]:
                out.append((arg, label, make, strict))
        for arg, bad in self.extra_bad.items():  # arguments with bad values of their own only (no kind)
            if arg not in self.kinds:
                out.extend((arg, label, make, strict) for label, make, strict in bad)
        return out


CASES: dict[str, Case] = {}
RECORDS: dict[str, str] = {}
"""``"module:name" -> reason``: public classes that are result records (circuitkit builds them and hands them
back; their fields are checked where they are computed), so only their valid construction is exercised."""


def case(key: str, valid: Callable[[], dict[str, Any]], /, **kinds: Any) -> None:
    """``kinds``: argument -> kind; besides, ``positional`` (names passed positionally), ``extra_bad`` (argument ->
    further bad values), ``target`` (builds the callable, for bound methods), ``context`` (see :attr:`Case.context`)
    and ``named_kinds`` (argument -> kind for arguments whose names are taken by these options, e.g. an argument
    called ``target``)."""
    assert key not in CASES, key
    positional = kinds.pop("positional", ())
    extra_bad = kinds.pop("extra_bad", None) or {}
    target = kinds.pop("target", None)
    context = kinds.pop("context", None) or {}
    kinds.update(kinds.pop("named_kinds", None) or {})
    CASES[key] = Case(key, valid, kinds, positional, extra_bad, target, context=context)


def record(key: str, reason: str) -> None:
    RECORDS[key] = reason


def method(key: str, instance: Callable[[], Any], valid: Callable[[], dict[str, Any]], /, **kinds: Any) -> None:
    """A bound method: ``key`` is ``module:Class.method``; ``instance()`` builds the object."""
    name = key.rpartition(".")[2]
    case(key, valid, target=lambda: getattr(instance(), name), **kinds)


def tmp_out_dir() -> str:

    return str(_scratch() / "out")


# --- circuitkit (top level): weights, spectra, composition
W = "weights"
case("circuitkit:HeadWeights", lambda: {k: v for k, v in weights().tensors().items() if k in ("W_Q", "W_K", "W_V",
     "W_O", "W_E", "W_U")}, W_Q="tensor", W_K="tensor", W_V="tensor", W_O="tensor", W_E="tensor?", W_U="tensor?")
case("circuitkit:Factored", lambda: {"A": torch.randn(3, 4, 2), "B": torch.randn(3, 2, 5)}, A="tensor", B="tensor")
for _name in ("qk_circuit", "ov_circuit", "full_qk_circuit", "full_ov_circuit"):
    case(f"circuitkit:{_name}", lambda: {"weights": weights()}, weights=W)
for _name in ("singular_values", "effective_rank", "frobenius_norm"):
    case(f"circuitkit:{_name}", lambda: {"weights": weights(), "circuit": "OV"}, weights=W, circuit="option")
case("circuitkit:numerical_rank", lambda: {"weights": weights(), "circuit": "QK", "rtol": 1e-6}, weights=W,
     circuit="option", rtol="real>=0?")
case("circuitkit:ov_eigenvalues", lambda: {"weights": weights(), "full": True}, weights=W, full="bool")
case("circuitkit:composition_scores", lambda: {"weights": weights(), "mode": "Q", "baseline": "zscore",
     "memory_budget": 2**20}, weights=W, mode="option", baseline="option?", memory_budget="int>=1")
case("circuitkit:composition_baseline", lambda: {"weights": weights(), "mode": "V", "n_samples": 4, "seed": 0},
     weights=W, mode="option", n_samples="size>=2", seed="seed")
case("circuitkit:top_edges", lambda: {"scores": comp_scores(), "k": 3}, scores="tensor", k="int>=1")
record("circuitkit:Edge", "result record of top_edges")
case("circuitkit:HeadValues", lambda: {"values": torch.randn(3, 2), "name": "effect"}, values="tensor", name="text")
case("circuitkit:EdgeValues", lambda: {"values": torch.randn(2, 2, 2, 2, 3), "name": "attribution"}, values="tensor",
     name="text")
case("circuitkit:bootstrap_ci", lambda: {"values": torch.randn(6, 2), "n_resamples": 50, "level": 0.9, "seed": 0,
     "statistic": None}, positional=("values",), values="tensor-any-rank", n_resamples="size>=2", level="real>0",
     seed="seed", statistic="callable?",
     extra_bad={"values": [("one-sequence", const(torch.ones(1, 2)), STRICT)],
                "level": [("one", const(1.0), STRICT), ("above-one", const(1.5), STRICT)]})
record("circuitkit:CircuitkitError", "the error type itself")
record("circuitkit.theory:FeatureMap", "a typing.Literal alias of option strings (fuzzed as feature_map=)")
record("circuitkit:CompositionBaseline", "result record of composition_baseline")

# --- detection
case("circuitkit:RepeatedTokens", lambda: {"block_len": 4, "n_repeats": 2, "batch": 2, "seed": 0, "bos": 0,
     "token_range": (1, 8)}, block_len="int>=2?", n_repeats="int>=2", batch="int>=1", seed="seed", bos="int>=0?",
     token_range="heads", extra_bad={"token_range": ENDLESS_INTS})
case("circuitkit:head_scores", lambda: {"model": toy(), "tokens": spec(), "device": "cpu"}, positional=("model",),
     model="model", tokens="tokens", device="device?")
case("circuitkit:induction_loss", lambda: {"model": toy(), "tokens": spec(), "device": "cpu"}, positional=("model",),
     model="model-loss", tokens="tokens", device="device?")
case("circuitkit:ablation_effects", lambda: {"model": toy(), "tokens": spec(), "method": "zero", "heads": [(0, 1)],
     "resume": True, "device": "cpu"}, positional=("model",), model="model-loss", tokens="tokens",
     method="option", heads="heads", resume="bool", device="device?")
case("circuitkit:attribution_effects", lambda: {"model": toy(), "tokens": spec(), "method": "mean",
     "device": "cpu"}, positional=("model",), model="model-loss", tokens="tokens", method="option", device="device?")
case("circuitkit:copying_scores", lambda: {"weights": weights()}, weights=W)
record("circuitkit:HeadEffects", "result record of ablation_effects / attribution_effects (its top() is fuzzed)")
record("circuitkit:Scan", "result record of scan() (its top() and save() are fuzzed)")
case("circuitkit:scan", lambda: {"model": toy(), "tokens": spec(), "ablate": "top", "ablate_top": 2,
     "ablation_method": "mean", "top_k": 2, "circuit": False, "n_resamples": 20, "ci_level": 0.9, "random_sets": 0,
     "stability": 0}, positional=("model",), model="model-loss?", tokens="tokens", ablate="option?",
     ablate_top="int>=1?", ablation_method="option?", top_k="int>=1", circuit="bool", n_resamples="size>=2",
     ci_level="real>0", random_sets="size>=0", stability="size>=0", search="option?",
     extra_bad={"ci_level": [("one", const(1.0), STRICT)],
                "search_options": [("a-list", const([("max_passes", 5)]), STRICT),
                                   ("beside-ranked", const({"max_passes": 5}), STRICT),
                                   ("a-string", const("max_passes=5"), STRICT)],
                "roles": [*ENDLESS, ("blank-name", const([(" ", "induction")]), STRICT),
                          ("tab-name", const([("\t", "induction")]), STRICT)]})

record("circuitkit:Track", "result record of track() (built and checked by it; Track.load reads a saved one)")
case("circuitkit:track", lambda: {"checkpoints": [toy(), toy()], "steps": [0, 100], "tokens": spec(), "top_k": 2,
     "out": tmp_out_dir(), "resume": True, "write_track": True, "device": "cpu", "allow_download": False,
     "progress": False}, positional=("checkpoints",), tokens="tokens", top_k="int>=0", out="out_dir?",
     resume="bool", write_track="bool", device="device?", allow_download="bool", progress="bool?",
     extra_bad={"checkpoints": [("empty", const([]), STRICT), ("none", const(None), STRICT),
                                ("missing-dir", const(["/nonexistent/step100"]), STRICT),
                                *[(label, (lambda m: lambda v: [m(v)])(make), s)
                                  for label, make, s in CHECKPOINT_NAMES],
                                ("endless", lambda v: (toy() for _ in itertools.count()), STRICT)],
                "out": [("holds-a-scan", lambda v: _scan_directory(), STRICT)],
                "steps": [("duplicate", const([5, 5]), STRICT), ("too-few", const([1]), STRICT),
                          ("negative", const([-1, 2]), STRICT)]})


# --- circuitkit.tracking: what a track reads back
record("circuitkit.tracking:SavedTrack", "result record of Track.save")
case("circuitkit.tracking:merge", lambda: {"directory": track_directory()}, directory="track_dir")
method("circuitkit.tracking.result:Track.load", lambda: __import__("circuitkit").Track,
       lambda: {"path": track_directory()}, path="track_dir")
case("circuitkit.tracking:load_checkpoint", lambda: {"checkpoint": checkpoint_directory(), "device": "cpu",
     "allow_download": False}, checkpoint="checkpoint_name", device="device?", allow_download="bool")
case("circuitkit.tracking:step_from_name", lambda: {"name": "step100"}, name="text",
     extra_bad={"name": [("4301-digits", const("step" + "1" * 4301), STRICT)]})

record("circuitkit:Circuit", "result record of find_circuit() (built and checked by it)")
record("circuitkit:CircuitRecord", "the record every found circuit is (built and checked by find_circuit, scan_task)")
record("circuitkit:ScanResult", "the abstract kind every scan result is (Scan, TaskScan: built by scan)")
record("circuitkit.circuits:CircuitRecord", "the record every found circuit is (built and checked by the searches)")
method("circuitkit.circuits.record:CircuitRecord.interval", lambda: __import__("circuitkit").CircuitRecord(
    heads=((0, 1),), faithfulness=0.9, necessity=1.0, target=0.8, curve=(),
    intervals={"faithfulness": (0.8, 0.95), "necessity": None, "losses": {"clean": (0.1, 0.2)}}),
    lambda: {"figure": "faithfulness"}, figure="option")
case("circuitkit:find_circuit", lambda: {"model": toy(), "tokens": spec(), "target": 0.8, "method": "mean",
     "necessity": True, "rank": "effect", "corrupt_seed": 0, "n_resamples": 20, "ci_level": 0.9, "random_sets": 0,
     "stability": 0, "device": "cpu"}, positional=("model",), model="model-loss", tokens="tokens", method="option",
     necessity="bool", rank="option", corrupt_seed="seed", n_resamples="size>=2", ci_level="real>0",
     random_sets="size>=0", stability="size>=0", device="device?", named_kinds={"target": "real>0"},
     extra_bad={"target": [("above-one", const(1.5), STRICT), ("zero", const(0.0), STRICT)],
                "ranking": [("not-heads", const("abc"), STRICT), ("too-few", const([(0, 0)]), STRICT)]})
CASES["circuitkit:find_circuit"].run_valid = False  # random toy weights: no head moves the loss (a clear error)
case("circuitkit:faithfulness", lambda: {"model": toy(), "heads": [(0, 1)], "tokens": spec(), "method": "mean",
     "corrupt_seed": 0, "device": "cpu"}, positional=("model", "heads"), model="model-loss", heads="heads",
     tokens="tokens", method="option", corrupt_seed="seed", device="device?",
     extra_bad={"heads": [("empty", const([]), STRICT)]})
CASES["circuitkit:faithfulness"].run_valid = False  # random toy weights: no head moves the loss (a clear error)

@cache
def track_result():
    """A two-checkpoint track of toy models (for Track.chart)."""
    import circuitkit as ck

    return ck.track([toy(), toy()], steps=[0, 100], tokens=spec(), top_k=2, out=tmp_out_dir(), progress=False)


method("circuitkit.tracking.result:Track.chart", track_result, lambda: {"score": "induction", "highlight": ["1.0"],
       "hline": 0.3}, score="option", highlight="text", hline="real?",
       extra_bad={"highlight": [("not-names", const([1, 2]), STRICT)]})

# --- circuitkit.detect
record("circuitkit.detect:InductionLoss", "result record of induction_loss")
record("circuitkit.detect:TokenBatch", "built by RepeatedTokens.build; every runner checks a user's TokenBatch "
       "(the tokens argument is fuzzed with malformed TokenBatch values)")
record("circuitkit.detect:ScoreDefinition", "built by pattern_score/weight_score, which validate it")
record("circuitkit.detect:HeadScores", "result record of head_scores (its methods are fuzzed)")
case("circuitkit.detect:agreement", lambda: {"attribution": attribution(), "ablation": effects()},
     attribution="scan", ablation="scan")


def _targets(tokens):
    from circuitkit.detect.tokens import previous_targets

    return previous_targets(tokens)


case("circuitkit.detect:pattern_score", lambda: {"name": "fuzz_prev", "short": "fp", "description": "d",
     "targets": _targets}, name="text", short="text", description="text", targets="callable",
     extra_bad={"name": [("blank", const("  "), STRICT)]})
case("circuitkit.detect:weight_score", lambda: {"name": "fuzz_w", "short": "fw", "description": "d",
     "compute": lambda w: None, "neutral": 0.0}, name="text", short="text", description="text",
     compute="callable", neutral="real?")
case("circuitkit.detect:pattern_scores", lambda: {"patterns": head_scores_result().patterns[:, :, :].reshape(
     1, 4, *head_scores_result().patterns.shape[-2:]).repeat(2, 1, 1, 1), "tokens": batch().tokens},
     patterns="tensor", tokens="token_ids-novocab")
def _column_named(field: str, value: str):
    from circuitkit import detect

    names = {"name": "fuzz_col", "short": "fzc"} | {field: value}
    return detect.weight_score(names["name"], short=names["short"], description="d", compute=lambda w: None)


case("circuitkit.detect:register", lambda: {"definition": None}, definition="scan",
     extra_bad={"definition": [("short-attrib", lambda v: _column_named("short", "attrib"), STRICT),
                               ("short-ablated", lambda v: _column_named("short", "ablated"), STRICT),
                               ("name-attribution", lambda v: _column_named("name", "attribution"), STRICT)]})
CASES["circuitkit.detect:register"].run_valid = False  # registering mutates global state
case("circuitkit.detect:registered", lambda: {"kind": "pattern"}, kind="option?")
case("circuitkit.detect:score_names", lambda: {})
case("circuitkit.detect:unregister", lambda: {"name": "induction"}, name="text",
     extra_bad={"name": [("unknown", const("no-such-score"), STRICT)]})
CASES["circuitkit.detect:unregister"].run_valid = False  # its valid call would remove a built-in score

# --- circuitkit.models
case("circuitkit.models:AttentionOnlyModel", lambda: {"weights": weights(), "attention": "soft", "n_ctx": N_CTX,
     "attn_scale": 2.0}, weights=W, attention="option", n_ctx="size>=1?", attn_scale="real>0?")
case("circuitkit.models:ToyConfig", lambda: {"n_layers": 2, "n_heads": 2, "d_model": 8, "d_head": 4, "d_vocab": 16,
     "n_ctx": 8, "n_key_value_heads": None, "attention": "soft", "attn_scale": None, "attn_only": True,
     "normalization_type": None, "default_prepend_bos": False}, n_layers="int>=1", n_heads="int>=1",
     d_model="int>=1", d_head="int>=1", d_vocab="int>=1?", n_ctx="int>=1", n_key_value_heads="int>=1?",
     attention="option", attn_scale="real>0?", default_prepend_bos="bool",
     extra_bad={"n_key_value_heads": [("not-a-divisor", const(3), STRICT)],
                "attn_only": [("False", const(False), STRICT)],
                "normalization_type": [("LN", const("LN"), STRICT)]})
record("circuitkit.models:HOOKS", "a namespace of TransformerLens hook names (HOOKS.z(layer)), never built by users")
case("circuitkit:load_checkpoint", lambda: {"checkpoint": "induction-2l"}, checkpoint="text", device="device?",
     allow_download="bool")
case("circuitkit.models:load_model", lambda: {"name_or_path": "/nonexistent/dir"}, name_or_path="model-static?",
     device="device?", allow_download="bool", device_map="option?", n_devices="int>=1?",
     max_memory="heads", offload_folder="text")
CASES["circuitkit.models:load_model"].run_valid = False  # no Hugging Face model directory to load offline
case("circuitkit.models:to_bridge", lambda: {"model_or_weights": weights(), "device": "cpu"},
     model_or_weights=W, device="device?")

# --- circuitkit.handbuilt


def _layout():
    from circuitkit.handbuilt import ResidualLayout

    return ResidualLayout(8, {"a": range(0, 2), "b": range(2, 4), "c": range(4, 8)})


def _code():
    from circuitkit.handbuilt import PositionCode

    return PositionCode(8)


def _qk():
    from circuitkit.handbuilt import match_qk

    return match_qk(_layout()["a"], _layout()["b"], d_head=2)


def _ov():
    from circuitkit.handbuilt import copy_ov

    return copy_ov(_layout()["a"], _layout()["b"], d_head=2)


def _head_spec():
    from circuitkit.handbuilt import HeadSpec

    return HeadSpec(qk=_qk(), ov=_ov(), name="h")


SPEC_LAYERS: list[Bad] = [
    ("None", const(None), STRICT),
    ("str", const("layers"), STRICT),
    ("empty", const([]), STRICT),
    ("empty-layer", const([[]]), STRICT),
    ("not-a-spec", const([[3]]), STRICT),
    ("flat-list", lambda v: [_head_spec()], STRICT),
]

HEAD_PARTS: list[Bad] = [("str", const("qk"), STRICT), ("int", const(3), STRICT), ("tuple", const((0, 1)), STRICT),
                         ("subspace", lambda v: _layout()["a"], STRICT)]
case("circuitkit.handbuilt:HeadSpec", lambda: {"qk": _qk(), "ov": _ov(), "name": "h"}, name="text",
     extra_bad={"qk": [*HEAD_PARTS, ("an-OV", lambda v: _ov(), STRICT)],
                "ov": [*HEAD_PARTS, ("a-QK", lambda v: _qk(), STRICT)]})
case("circuitkit.handbuilt:QK", lambda: {"W_Q": torch.randn(8, 2), "W_K": torch.randn(8, 2), "b_Q": torch.randn(2)},
     W_Q="tensor", W_K="tensor", b_Q="tensor?")
case("circuitkit.handbuilt:OV", lambda: {"W_V": torch.randn(8, 2), "W_O": torch.randn(2, 8)}, W_V="tensor",
     W_O="tensor")
case("circuitkit.handbuilt:PositionCode", lambda: {"n_ctx": 8}, n_ctx="size>=2")
case("circuitkit.handbuilt:ResidualLayout", lambda: {"d_model": 8, "spaces": {"a": [0, 1], "b": [2, 3]}},
     d_model="size>=1", spaces="heads",
     extra_bad={"spaces": [("blank-name", const({" ": [0, 1]}), STRICT), ("empty-name", const({"": [0]}), STRICT),
                           ("int-name", const({3: [0]}), STRICT), ("float-dims", const({"a": [0.0, 1.0]}), STRICT),
                           ("bool-dims", const({"a": [True]}), STRICT),
                           ("endless-dims", lambda v: {"a": itertools.count()}, STRICT)]})
case("circuitkit.handbuilt:Subspace", lambda: {"name": "a", "dims": (0, 1), "d_model": 8}, name="text",
     dims="heads", d_model="size>=1")
record("circuitkit.handbuilt:InductionCircuit", "result record of induction_circuit")
record("circuitkit.handbuilt:VirtualHeadExercise", "result record of virtual_head_exercise")
case("circuitkit.handbuilt:assemble", lambda: {"layers": [[_head_spec()]], "d_model": 8, "d_head": 2,
     "W_E": torch.randn(D_VOCAB, 8), "W_U": torch.randn(8, D_VOCAB), "attention": "soft", "n_ctx": 8,
     "attn_scale": 1.0}, extra_bad={"layers": SPEC_LAYERS}, d_model="size>=1?", d_head="size>=1?", W_E="tensor?",
     W_U="tensor?", attention="option", n_ctx="size>=1?", attn_scale="real>0?")
case("circuitkit.handbuilt:assemble_weights", lambda: {"layers": [[_head_spec()]], "d_model": 8, "d_head": 2,
     "W_pos": torch.randn(8, 8)}, extra_bad={"layers": SPEC_LAYERS}, d_model="size>=1?", d_head="size>=1?",
     W_pos="tensor?")
case("circuitkit.handbuilt:check_disjoint", lambda: {"subspaces": [_layout()["a"], _layout()["b"]]},
     subspaces="heads")
case("circuitkit.handbuilt:copy_ov", lambda: {"src": _layout()["a"], "dst": _layout()["b"], "scale": 2.0,
     "d_head": 4}, src="subspace", dst="subspace", scale="real", d_head="size>=1?")
case("circuitkit.handbuilt:induction_circuit", lambda: {"d_vocab": 8, "n_ctx": 8, "gap": 20.0, "logit_scale": 10.0,
     "attention": "hard"}, d_vocab="size>=2", n_ctx="size>=2", gap="real>0", logit_scale="real>0",
     attention="option")
case("circuitkit.handbuilt:key_bias_qk", lambda: {"key": _layout()["a"], "bias": 1.0}, key="subspace", bias="real")
case("circuitkit.handbuilt:match_qk", lambda: {"query": _layout()["a"], "key": _layout()["b"], "scale": 1.0,
     "d_head": 4}, query="subspace", key="subspace", scale="real", d_head="size>=1?")
case("circuitkit.handbuilt:previous_token_pattern", lambda: {"n_pos": 5, "dtype": torch.float64}, n_pos="size>=1",
     dtype="dtype")
case("circuitkit.handbuilt:previous_token_qk", lambda: {"positions": _positions(), "code": _code(), "offset": 1,
     "scale": 1.0, "d_head": None}, positions="subspace", code="scan", offset="int>=1", scale="real")
case("circuitkit.handbuilt:repeated_tokens", lambda: {"d_vocab": 8, "length": 4, "batch": 2, "seed": 0,
     "distinct": True}, d_vocab="size>=1", length="size>=1", batch="size>=1", seed="seed", distinct="bool")
case("circuitkit.handbuilt:virtual_head_exercise", lambda: {})
method("circuitkit.handbuilt.subspace:ResidualLayout.stack", _layout, lambda: {"d_model": 8, "a": 2, "b": 3},
       d_model="size>=1?", a="size>=1")
OPERANDS: list[Bad] = [("int", const(3), STRICT), ("str", const("x"), STRICT), ("None", const(None), STRICT),
                       ("list", const([[1.0] * 8] * 8), STRICT), ("numpy", const(np.ones((8, 8))), STRICT),
                       ("wrong-rows", const(torch.ones(5, 8)), STRICT), ("vector", const(torch.ones(8)), STRICT),
                       ("int-dtype", const(torch.ones(8, 8, dtype=torch.long)), STRICT),
                       ("wrong-batch", const(torch.ones(7, 8, 8)), STRICT),
                       ("nan", const(torch.full((8, 8), math.nan)), STRICT)]


def _factored():
    from circuitkit import Factored

    g = torch.Generator().manual_seed(0)
    return Factored(torch.randn(2, 3, 8, 4, generator=g), torch.randn(2, 3, 4, 8, generator=g))


method("circuitkit.factored:Factored.__matmul__", _factored, lambda: {"other": torch.eye(8)}, positional=("other",),
       extra_bad={"other": OPERANDS})
method("circuitkit.factored:Factored.__rmatmul__", _factored, lambda: {"other": torch.eye(8)}, positional=("other",),
       extra_bad={"other": OPERANDS})
method("circuitkit.factored:Factored.__getitem__", _factored, lambda: {"index": (1, 2)}, positional=("index",),
       extra_bad={"index": [("out-of-range", const(5), STRICT), ("negative-out", const(-3), STRICT),
                            ("second-axis-out", const((0, 3)), STRICT), ("str", const("a"), STRICT),
                            ("float", const(0.5), STRICT), ("None", const(None), STRICT),
                            ("too-many", const((0, 0, 0)), STRICT), ("empty-slice", const(slice(1, 1)), STRICT),
                            ("mask-wrong-length", const(torch.tensor([True, False, True])), STRICT)]})
ADDENDS: list[Bad] = [("int", const(1), STRICT), ("None", const(None), STRICT), ("tensor", const(torch.eye(8)), STRICT),
                      ("str", const("x"), STRICT)]
method("circuitkit.handbuilt.heads:QK.__add__", _qk, lambda: {"other": _qk()}, positional=("other",),
       extra_bad={"other": [*ADDENDS, ("an-OV", lambda v: _ov(), STRICT)]})
method("circuitkit.handbuilt.heads:OV.__add__", _ov, lambda: {"other": _ov()}, positional=("other",),
       extra_bad={"other": [*ADDENDS, ("a-QK", lambda v: _qk(), STRICT)]})
method("circuitkit.handbuilt.subspace:Subspace.__getitem__", lambda: _layout()["c"], lambda: {"index": 1},
       positional=("index",), extra_bad={"index": [
           ("out-of-range", const(4), STRICT), ("negative-out", const(-5), STRICT), ("str", const("a"), STRICT),
           ("float", const(1.5), STRICT), ("bool", const(True), STRICT), ("None", const(None), STRICT),
           ("tuple", const((0, 1)), STRICT), ("empty-slice", const(slice(2, 2)), STRICT),
           ("zero-step", const(slice(None, None, 0)), STRICT), ("numpy-out", const(np.int64(9)), STRICT)]})
method("circuitkit.handbuilt.subspace:Subspace.__add__", lambda: _layout()["a"], lambda: {"other": _layout()["b"]},
       positional=("other",), extra_bad={"other": [*ADDENDS, ("overlapping", lambda v: _layout()["a"], STRICT)]})
method("circuitkit.handbuilt.subspace:Subspace.read", lambda: _layout()["a"], lambda: {"resid": torch.ones(3, 8)},
       resid="tensor-any-rank", extra_bad={"resid": [("wrong-width", const(torch.ones(3, 5)), STRICT),
                                                     ("scalar", const(torch.tensor(1.0)), STRICT)]})
method("circuitkit.handbuilt.exercises:VirtualHeadExercise.paths", lambda: __import__("circuitkit").build
       .virtual_head_exercise(), lambda: {"x": torch.randn(1, 3, 16)}, x="tensor",
       extra_bad={"x": [("wrong-width", const(torch.ones(1, 3, 8)), STRICT),
                        ("no-positions", const(torch.ones(1, 0, 16)), STRICT)]})
method("circuitkit.handbuilt.subspace:Subspace.span", lambda: _layout()["a"], lambda: {"name": "s", "start": 0,
       "stop": 2, "d_model": 8}, name="text", start="int>=0", stop="int>=1", d_model="size>=1")


@cache
def _induction():
    from circuitkit.handbuilt import induction_circuit

    return induction_circuit(8, 8)


@cache
def _exercise():
    from circuitkit.handbuilt import virtual_head_exercise

    return virtual_head_exercise()


def _positions():
    from circuitkit.handbuilt import ResidualLayout

    return ResidualLayout(_code().dim, {"pos": range(_code().dim)})["pos"]


# --- circuitkit.viz


def _patterns():
    return head_scores_result().patterns[0]  # [head, pos, pos]


def _token_strs():
    return [f"t{i}" for i in range(_patterns().shape[-1])]


@cache
def _rendered():
    from circuitkit.viz import attention_patterns

    return attention_patterns(_patterns(), _token_strs())


STRING_LISTS: list[Bad] = [
    ("None", const(None), STRICT),
    ("str", const("t0 t1"), STRICT),
    ("too-short", lambda v: list(v)[:1], STRICT),
    ("too-long", lambda v: [*v, "x"], STRICT),
    ("ints", lambda v: list(range(len(v))), STRICT),
    ("bytes", lambda v: [s.encode() for s in v], STRICT),
]

record("circuitkit.viz:CircuitsVisView", "result record of attention_heads / attention_patterns")
case("circuitkit.viz:attention_heads", lambda: {"patterns": _patterns(), "tokens": _token_strs(),
     "head_names": ["a", "b"], "mask_upper_tri": True}, patterns="tensor", mask_upper_tri="bool",
     extra_bad={"tokens": STRING_LISTS, "head_names": STRING_LISTS})
case("circuitkit.viz:attention_patterns", lambda: {"patterns": _patterns(), "tokens": _token_strs()},
     patterns="tensor", extra_bad={"tokens": STRING_LISTS})
case("circuitkit.viz:composition_graph", lambda: {"edges": __import__("circuitkit").top_edges(comp_scores(), 3),
     "n_layers": 2, "n_heads": 2, "title": "t"}, edges="heads", n_layers="size>=1?", n_heads="size>=1?",
     title="text")
case("circuitkit.viz:composition_heatmap", lambda: {"scores": comp_scores(), "baseline": 0.25, "mode": "K"},
     scores="tensor", baseline="real?", mode="text")
case("circuitkit.viz:head_score_heatmap", lambda: {"scores": torch.rand(2, 3), "title": "t", "zmin": 0.0,
     "zmax": 1.0, "colorscale": "Viridis", "zmid": None}, scores="tensor", title="text", zmin="real?",
     zmax="real?", colorscale="option", zmid="real?")
case("circuitkit.viz:head_score_heatmaps", lambda: {"scores": {"a": torch.rand(2, 3)}}, scores="heads")
case("circuitkit.viz:model_patterns", lambda: {"model": toy(), "tokens": batch().tokens[0], "heads": [(0, 1)]},
     model="model", tokens="token_ids", heads="heads")
case("circuitkit.viz:notebook_figures", lambda: {"png": True}, png="bool")
case("circuitkit.viz:parse_rendered", lambda: {"rendered": _rendered()}, rendered="scan")
case("circuitkit.viz:singular_value_spectra", lambda: {"source": weights(), "circuit": "QK", "scale": "linear"},
     source=W, circuit="option", scale="option")
case("circuitkit.viz:token_strings", lambda: {"model": bridge(), "tokens": batch().tokens[0]}, model="model",
     tokens="token_ids")
case("circuitkit.viz:view_props", lambda: {"view": _rendered()}, view="scan")

# --- circuitkit.circuits
for _name in ("AttributedEdge", "CircuitEvidence", "EdgeAttribution", "EdgeEffect", "EdgeEvidence",
              "PathPatching"):
    record(f"circuitkit.circuits:{_name}", "result record of edge_attribution / path_patching / circuit_evidence")
record("circuitkit.circuits:EdgeMeasure", "built by edge_measure, which validates it")
record("circuitkit.circuits:CurvePoint", "result record of a circuit's faithfulness curve (built by the searches)")
record("circuitkit.circuits:NoBehaviour", "the error type raised where ablating everything moves nothing")
record("circuitkit.circuits:EdgeInputs", "what the evidence hands a measure's compute (built by circuit_evidence)")
case("circuitkit.circuits:edge_measure", lambda: {"name": "weighted", "column": "composition x attribution",
     "description": "composition times attribution", "compute": lambda inputs: inputs.measured["composition"].values},
     name="text", column="text", description="text", compute="callable",
     extra_bad={"name": [("reserved", const("src"), STRICT), ("not-identifier", const("two words"), STRICT)]})
case("circuitkit.circuits:EdgeSpec", lambda: {"src": (0, 0), "dst": (1, 1), "channel": "K"}, src="head",
     dst="head", channel="option")
case("circuitkit.circuits:circuit_evidence", lambda: {"model": toy(), "composition": None, "top_k": 2,
     "n_patch": 2, "metric": "loss", "corrupt": "resample", "tokens": spec(), "corrupt_seed": 1, "device": "cpu",
     "n_resamples": 50, "ci_level": 0.9}, positional=("model",), model="model-loss", top_k="int>=1",
     n_patch="int>=1?", metric="option", corrupt="option", tokens="tokens", corrupt_seed="seed", device="device?",
     n_resamples="size>=2", ci_level="real>0")
case("circuitkit.circuits:edge_attribution", lambda: {"model": toy(), "metric": "loss", "corrupt": "resample",
     "tokens": spec(), "corrupt_seed": 1, "device": "cpu"}, positional=("model",), model="model-loss",
     metric="option", corrupt="option", tokens="tokens", corrupt_seed="seed", device="device?")
case("circuitkit.circuits:path_patching", lambda: {"model": toy(), "edges": [((0, 0), (1, 1))], "input": "k",
     "metric": "loss", "corrupt": "resample", "tokens": spec(), "corrupt_seed": 1, "edges_per_pass": 1,
     "device": "cpu", "n_resamples": 50, "ci_level": 0.9}, positional=("model",), model="model-loss", edges="heads",
     input="option", metric="option", corrupt="option", tokens="tokens", corrupt_seed="seed",
     edges_per_pass="int>=1?", device="device?", n_resamples="size>=2", ci_level="real>0")
case("circuitkit.circuits:resampled_batch", lambda: {"batch": batch(), "seed": 1, "copies": "all"}, batch="scan",
     seed="seed", copies="option")

# --- circuitkit.theory


def _qkv(n=5, d=4):
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(2, n, d, generator=g, dtype=torch.float64) for name in ("q", "k", "v")}


def _mha():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(2, 5, 8, generator=g), "W_Q": torch.randn(2, 8, 4, generator=g),
            "W_K": torch.randn(2, 8, 4, generator=g), "W_V": torch.randn(2, 8, 4, generator=g),
            "W_O": torch.randn(2, 4, 8, generator=g)}


def _self_attn():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(5, 8, generator=g), "W_Q": torch.randn(8, 4, generator=g),
            "W_K": torch.randn(8, 4, generator=g), "W_V": torch.randn(8, 4, generator=g)}


T = "circuitkit.theory"
MASK: list[Bad] = [
    ("float-mask", lambda v: v.float(), STRICT),
    ("wrong-shape", lambda v: v[..., :-1], STRICT),
    ("str", const("mask"), STRICT),
    ("all-masked", lambda v: torch.ones_like(v), STRICT),
    ("batch-mismatch", lambda v: torch.zeros(3, v.shape[-1], dtype=torch.bool), STRICT),
    ("1-d-over-a-batch", lambda v: torch.zeros(v.shape[-1] + 1, dtype=torch.bool), STRICT),
]
NP_MASK: list[Bad] = [
    ("batch-mismatch", lambda v: np.zeros((3, v.shape[-1]), dtype=bool), STRICT),
    ("wrong-length", lambda v: v[..., :-1], STRICT),
    ("int-mask", lambda v: v.astype(int), STRICT),
]
for _name, _np in (("sdpa_numpy", True), ("sdpa_torch", False), ("pattern_numpy", True), ("pattern_torch", False)):
    _keys = ("q", "k", "v") if _name.startswith("sdpa") else ("q", "k")

    def _valid(keys=_keys, as_np=_np):
        out = {k: (v.numpy() if as_np else v) for k, v in _qkv().items() if k in keys}
        mask = torch.zeros(2, 5, dtype=torch.bool)  # True marks padding
        out.update(causal=False, key_padding_mask=mask.numpy() if as_np else mask, scale=0.5)
        return out

    case(f"{T}:{_name}", _valid, causal="bool", scale="real?", extra_bad={"key_padding_mask": NP_MASK if _np else MASK},
         **{k: ("tensor-any-rank" if not _np else "np") for k in _keys})
case(f"{T}:split_heads", lambda: {"x": torch.randn(2, 5, 8), "n_heads": 2}, x="tensor", n_heads="size>=1",
     extra_bad={"n_heads": [("not-a-divisor", const(3), STRICT)]})
case(f"{T}:merge_heads", lambda: {"z": torch.randn(2, 2, 5, 4)}, z="tensor")
case(f"{T}:multi_head_attention", lambda: {**_mha(), "causal": True}, x="tensor", W_Q="tensor", W_K="tensor",
     W_V="tensor", W_O="tensor", causal="bool")
case(f"{T}:decode_with_kv_cache", _mha, x="tensor", W_Q="tensor", W_K="tensor", W_V="tensor", W_O="tensor")
record(f"{T}:KVCacheRun", "result record of decode_with_kv_cache")
for _name in ("linear_attention_quadratic", "linear_attention_linear", "linear_attention_gap"):
    case(f"{T}:{_name}", lambda: {**_qkv(), "feature_map": "elu1", "causal": True}, q="tensor-any-rank",
         k="tensor-any-rank", v="tensor-any-rank", feature_map="option", causal="bool")
case(f"{T}:self_attention", lambda: {**_self_attn(), "causal": False}, x="tensor", W_Q="tensor", W_K="tensor",
     W_V="tensor", causal="bool")
case(f"{T}:permutation_equivariance_error", lambda: {**_self_attn(), "perm": [4, 3, 2, 1, 0]}, x="tensor",
     W_Q="tensor", W_K="tensor", W_V="tensor", perm="heads",
     extra_bad={"perm": [("not-a-permutation", const([0, 0, 1, 2, 3]), STRICT),
                         ("too-short", const([1, 0]), STRICT)]})
record(f"{T}:DotProductStats", "result record of dot_product_variance")
case(f"{T}:dot_product_variance", lambda: {"d_k": 4, "n_samples": 100, "scaled": True, "seed": 0},
     d_k="size>=1", n_samples="size>=2", scaled="bool", seed="seed")
case(f"{T}:softmax_saturation", lambda: {"d_k": 4, "n_keys": 4, "n_samples": 50, "scaled": False, "seed": 0},
     d_k="size>=1", n_keys="size>=1", n_samples="size>=1", scaled="bool", seed="seed")
case(f"{T}:softmax_jacobian", lambda: {"z": torch.tensor([0.1, 0.5, -0.3])}, z="tensor")
record(f"{T}:AttentionRank", "result record of attention_rank")
case(f"{T}:attention_rank", lambda: {"n": 6, "d_k": 2, "d_v": 2, "n_heads": 2, "d_model": 8, "seed": 0},
     n="size>=1", d_k="size>=1", d_v="size>=1", n_heads="size>=1", d_model="size>=1?", seed="seed")
record(f"{T}:LinearAttentionGD", "result record of linear_attention_gd")
case(f"{T}:linear_attention_gd", lambda: {"X": torch.randn(6, 3), "Y": torch.randn(6, 2),
     "x_test": torch.randn(4, 3), "lr": 0.5}, X="tensor", Y="tensor", x_test="tensor", lr="real")
case(f"{T}:sinusoidal_offset_error", lambda: {"n_pos": 8, "d_model": 8, "offset": 2, "base": 100.0},
     n_pos="size>=1", d_model="size>=2", offset="int>=0", base="real>0")
case(f"{T}:rope_score", lambda: {"q": torch.randn(4), "k": torch.randn(4), "m": 2.0, "n": 5.0, "base": 100.0},
     q="tensor", k="tensor", m="real", n="real", base="real>0")
case(f"{T}:rope_offset_error", lambda: {"q": torch.randn(4), "k": torch.randn(4), "m": 2.0, "n": 5.0,
     "shift": 3.0}, q="tensor", k="tensor", m="real", n="real", shift="real")
case(f"{T}:layernorm_output_norm", lambda: {"x": torch.randn(3, 8), "gamma": 1.5, "beta": 0.1}, x="tensor",
     gamma="real", beta="real")
case(f"{T}:sinusoidal_frequencies", lambda: {"d_model": 8, "base": 100.0}, d_model="size>=2", base="real>0")
case(f"{T}:sinusoidal_encoding", lambda: {"n_pos": 5, "d_model": 8}, n_pos="size>=1", d_model="size>=2")
case(f"{T}:sinusoidal_offset_map", lambda: {"offset": 2, "d_model": 8}, offset="int>=0", d_model="size>=2")
case(f"{T}:rope_rotation_matrix", lambda: {"position": 3.0, "d": 4}, position="real", d="size>=2")
case(f"{T}:rope", lambda: {"x": torch.randn(2, 5, 4), "positions": [0.0, 1.0, 2.0, 3.0, 4.0]}, x="tensor",
     extra_bad={"positions": [("too-short", const([0.0]), STRICT), ("nan", const([math.nan] * 5), STRICT),
                              ("str", const("01234"), STRICT), ("inf", const([0.0, math.inf, 2.0, 3.0, 4.0]), STRICT),
                              ("huge", const([0.0, 1e300, 2.0, 3.0, 4.0]), STRICT)]})
record(f"{T}:RankCollapse", "result record of rank_collapse")
case(f"{T}:rank_collapse", lambda: {"n_layers": 3, "n_tokens": 4, "d_model": 8, "n_heads": 2, "d_head": 4,
     "plot_layers": [0, 3], "seed": 0}, n_layers="size>=1", n_tokens="size>=1", d_model="size>=1",
     n_heads="size>=1", d_head="size>=1", plot_layers="heads", seed="seed",
     extra_bad={"plot_layers": ENDLESS_INTS})
record(f"{T}:ChinchillaOptimal", "result record of chinchilla_optimal")
case(f"{T}:chinchilla_optimal", lambda: {"compute": 1e20, "tokens_per_param": 20.0,
     "flops_per_param_token": 6.0}, compute="real>0", tokens_per_param="real>0", flops_per_param_token="real>0")
case(f"{T}:param_count", lambda: {"n_layers": 2, "d_model": 8, "d_vocab": 16}, n_layers="int>=1",
     d_model="int>=1", d_vocab="int>=1")
case(f"{T}:mha_param_count", lambda: {"d_model": 8, "n_heads": 2}, d_model="int>=1", n_heads="int>=1")
OVERFLOWING: list[Bad] = [("overflows-float64", const(1e308), STRICT)]
case(f"{T}:training_flops", lambda: {"n_params": 1e6, "n_tokens": 1e7}, n_params="real>0", n_tokens="real>0",
     extra_bad={"n_params": OVERFLOWING, "n_tokens": OVERFLOWING})
case(f"{T}:inference_flops_per_token", lambda: {"n_params": 1e6}, n_params="real>0",
     extra_bad={"n_params": OVERFLOWING})
case(f"{T}:kv_cache_bytes", lambda: {"n_layers": 2, "n_kv_heads": 2, "d_head": 4, "n_tokens": 8,
     "bytes_per_value": 2, "batch": 1}, n_layers="int>=1", n_kv_heads="int>=1", d_head="int>=1",
     n_tokens="int>=1", bytes_per_value="int>=1", batch="int>=1")
case(f"{T}:kv_cache_saving", lambda: {"n_heads": 8, "n_kv_heads": 2}, n_heads="int>=1", n_kv_heads="int>=1")
case(f"{T}:jl_min_dim", lambda: {"n_points": 1000.0, "eps": 0.1}, n_points="real>0", eps="real>0")
case(f"{T}:receptive_field", lambda: {"n_layers": 2, "n_heads": 2}, n_layers="int>=1", n_heads="int>=1")
record(f"{T}:MultiHeadComplexity", "result record of multi_head_complexity")
case(f"{T}:multi_head_complexity", lambda: {"n_q": 4, "n_kv": 4, "d_head": 4, "n_heads": 2}, n_q="int>=1",
     n_kv="int>=1", d_head="int>=1", n_heads="int>=1")
case(f"{T}:rank_collapse_max_rate", lambda: {"retained_fraction": 0.5, "n_layers": 4},
     retained_fraction="real>0", n_layers="int>=1")
record(f"{T}:SelfAttentionCounts", "result record of self_attention_counts")
case(f"{T}:self_attention_counts", lambda: {"n_tokens": 4, "d": 8}, n_tokens="int>=1", d="int>=1")

# --- circuitkit.validate: the user's value is fuzzed; name/why/bounds/flags are the calling developer's arguments
V = "circuitkit.validate"
case(f"{V}:boolean", lambda: {"name": "x", "value": True}, value="bool")
case(f"{V}:device", lambda: {"name": "x", "value": "cpu"}, value="device")
case(f"{V}:fail", lambda: {"name": "x", "given": 3, "expected": "an int", "fix": ""})  # returns the error
case(f"{V}:given", lambda: {"text": "x"})
case(f"{V}:finite_result", lambda: {"name": "x", "value": torch.ones(2, 3)}, extra_bad={"value": [
    ("nan", lambda v: _poison(v, math.nan), STRICT), ("inf", lambda v: _poison(v, math.inf), STRICT),
    ("complex-nan", lambda v: _poison(v.to(torch.complex64), complex(math.nan, 0)), STRICT),
    ("str", const("x"), STRICT), ("None", const(None), STRICT), ("numpy-nan", const(np.array([math.nan])), STRICT),
    ("int-dtype", lambda v: v.long(), LENIENT), ("empty", lambda v: v[:0], LENIENT)]})
case(f"{V}:all_finite", lambda: {"value": torch.ones(2, 3)}, extra_bad={"value": [  # a predicate: NaN gives False
    ("str", const("x"), STRICT), ("None", const(None), STRICT), ("numpy", const(np.ones((2, 3))), STRICT)]})
case(f"{V}:integer", lambda: {"name": "x", "value": 3, "minimum": 0, "maximum": 5}, value="int>=0",
     extra_bad={"value": [("above-maximum", const(6), STRICT)]})
case(f"{V}:option", lambda: {"name": "x", "value": "a", "options": ("a", "b")}, value="option")
case(f"{V}:positive_int", lambda: {"name": "x", "value": 3}, value="int>=1")
case(f"{V}:real", lambda: {"name": "x", "value": 1.0, "minimum": 0.0, "maximum": 2.0}, value="real>=0",
     extra_bad={"value": [("above-maximum", const(2.5), STRICT)]})
case(f"{V}:seed", lambda: {"name": "x", "value": 3}, value="seed")
case(f"{V}:bounded_list", lambda: {"name": "x", "value": [(0, 0), (1, 1)], "limit": 4, "expected": "heads"},
     extra_bad={"value": [*ENDLESS, ("too-long", const([(0, 0)] * 5), STRICT), ("str", const("ab"), STRICT),
                          ("int", const(3), STRICT), ("None", const(None), STRICT)]})
case(f"{V}:tensor", lambda: {"name": "x", "value": torch.ones(2, 3), "shape": (2, None), "floating": True,
     "finite": True}, value="tensor", extra_bad={})
case(f"{V}:dense", lambda: {"name": "x", "value": torch.ones(2, 3)}, extra_bad={"value": [
    ("meta", lambda v: v.to("meta"), STRICT), ("sparse-coo", lambda v: v.to_sparse(), STRICT),
    ("sparse-csr", lambda v: v.to_sparse_csr(), STRICT), ("str", const("x"), STRICT),
    ("numpy", const(np.ones((2, 3))), STRICT)]})
CASES[f"{V}:tensor"].kinds = {}
CASES[f"{V}:tensor"].extra_bad = {"value": [b for b in _tensors(empty=False) if b[0] != "non-contiguous"]}

# --- circuitkit.zoo
Z = "circuitkit.zoo"
case(f"{Z}:available", lambda: {})
ZOO_PATHS = [("dotdot", const("../zoo/induction-2l"), STRICT), ("inner-dotdot", const("induction-2l/../induction-2l"),
             STRICT), ("absolute", const("/etc"), STRICT), ("name-too-long", const("x" * 300), STRICT)]
"""Names that would reach outside the bundled models' folder (or past NAME_MAX)."""
case(f"{Z}:curve", lambda: {"name": "induction-2l"}, name="zoo_name", extra_bad={"name": ZOO_PATHS})
case(f"{Z}:info", lambda: {"name": "induction-2l"}, name="zoo_name", extra_bad={"name": ZOO_PATHS})
case(f"{Z}:load", lambda: {"name": "induction-2l", "device": "cpu"}, name="zoo_name", device="device?",
     extra_bad={"name": ZOO_PATHS})
case(f"{Z}:native_config", lambda: {"directory": __import__("circuitkit.zoo").zoo.info().path},
     directory="out_dir")

# --- circuitkit.tasks: behaviours as clean/corrupted pairs
# The hand-built induction circuit (vocabulary 10) has a real behaviour on token-id pairs (``copy_next_task``), so a
# valid scan_task finds a circuit; the generators need a tokenizer that knows their words (``english_model``).
TK = "circuitkit.tasks"


@cache
def induction_model():
    from circuitkit.handbuilt import induction_circuit

    return induction_circuit(10, 16).model


@cache
def copy_task():
    from tests.test_tasks import copy_next_task

    return copy_next_task(4)


@cache
def english():
    from tests.test_tasks import english_model

    return english_model()


@cache
def task_file() -> str:
    import json

    path = _scratch() / "pairs.jsonl"
    path.write_text("".join(json.dumps(p.to_json()) + "\n" for p in copy_task().pairs))
    return str(path)


def bad_task_file(name: str, content: str | bytes | None = None, *, size: int | None = None,
                  link: str | None = None, fifo: bool = False) -> str:
    """A task file in a fresh temporary directory: ``content``, a sparse file of ``size`` bytes, a symlink to
    ``link`` or a FIFO (which would block a plain ``open``)."""

    path = _scratch() / name
    if link is not None:
        path.symlink_to(link)
    elif fifo:
        os.mkfifo(path)
    elif size is not None:
        with open(path, "wb") as handle:
            handle.truncate(size)
    else:
        path.write_bytes(content if isinstance(content, bytes) else (content or "").encode("utf-8"))
    return str(path)


@cache
def task_scan_result():
    from circuitkit.tasks import scan_task

    return scan_task(induction_model(), copy_task(), steps=1, edges=False)


def _task_with(**changes):
    from circuitkit.tasks import Task

    t = copy_task()
    return Task(**{"name": t.name, "pairs": t.pairs, **changes})


def _pairs_task(rows):
    from circuitkit.tasks import Task

    return Task.from_pairs(rows)


ROW = ([1, 2, 3], [1, 4, 3], [2], [4])
PROMPTS: list[Bad] = [
    ("None", const(None), STRICT),
    ("empty-str", const(""), STRICT),
    ("empty-list", const([]), STRICT),
    ("int", const(3), STRICT),
    ("bytes", const(b"a b"), STRICT),
    ("dict", const({"ids": [1]}), STRICT),
    ("float-ids", const([1.0, 2.0]), STRICT),
    ("nan-id", const([1, math.nan]), STRICT),
    ("bool-ids", const([True, False]), STRICT),
    ("negative-id", const([1, -1]), STRICT),
    ("2**70-id", const([1, 2**70]), STRICT),
    ("4400-digit-id", const([1, 10**4400]), STRICT),
    ("nested-lists", const([[1, 2], [3]]), STRICT),
    ("float-tensor", const(torch.tensor([1.0, 2.0])), STRICT),
    ("bool-tensor", const(torch.tensor([True, False])), STRICT),
    ("2-d-tensor", const(torch.ones(2, 2, dtype=torch.long)), STRICT),
    ("meta-tensor", const(torch.ones(2, dtype=torch.long, device="meta")), STRICT),
    ("too-long-text", const("a" * 20_001), STRICT),
    ("too-long-ids", const([1] * 20_001), STRICT),
    ("numpy-ids", const(np.array([1, 2])), LENIENT),
    ("long-tensor", const(torch.tensor([1, 2])), LENIENT),
]
ANSWERS: list[Bad] = [
    ("None", const(None), STRICT),
    ("empty-list", const([]), STRICT),
    ("empty-str", const(""), STRICT),
    ("17-answers", const(list(range(1, 18))), STRICT),
    ("list-of-lists", const([[2], [3]]), STRICT),
    ("float-id", const([2.0]), STRICT),
    ("bool-id", const([True]), STRICT),
    ("negative-id", const([-2]), STRICT),
    ("2**70-id", const([2**70]), STRICT),
    ("dict", const({"a": 1}), STRICT),
    ("object", const(object()), STRICT),
    ("too-long-text", const("a" * 20_001), STRICT),
    ("1e6-answers", const(list(range(10**6))), STRICT),
]
PAIR_LISTS: list[Bad] = [
    ("None", const(None), STRICT),
    ("str", const("clean,corrupted"), STRICT),
    ("int", const(3), STRICT),
    ("dict", const({"clean": "a"}), STRICT),
    ("empty", const([]), STRICT),
    ("three-fields", const([([1, 2], [1, 3], [2])]), STRICT),
    ("dict-missing-wrong", const([{"clean": [1, 2], "corrupted": [1, 3], "answer": [2]}]), STRICT),
    ("row-None", const([None]), STRICT),
    ("row-str", const(["a b c d"]), STRICT),
    *[(f"row-clean-{label}", (lambda m: lambda v: [(m(None), *ROW[1:])])(make), s) for label, make, s in PROMPTS
      if s],
    *[(f"row-answer-{label}", (lambda m: lambda v: [(*ROW[:2], m(None), ROW[3])])(make), s)
      for label, make, s in ANSWERS if s],
    ("endless", lambda v: itertools.repeat(ROW), STRICT),
    ("raising-iterator", lambda v: (ROW if i == 0 else 1 / 0 for i in range(3)), STRICT),
]
TASKS: list[Bad] = [
    ("str", const("a task"), STRICT),
    ("dict", const({"pairs": []}), STRICT),
    ("pair", lambda v: copy_task().pairs[0], STRICT),
    ("list-of-pairs", lambda v: list(copy_task().pairs), STRICT),
    ("object", const(object()), STRICT),
    ("out-of-vocab", lambda v: _pairs_task([([1, 2, 3], [1, 4, 3], [500], [4])]), STRICT),
    ("prompt-out-of-vocab", lambda v: _pairs_task([([1, 2, 300], [1, 4, 300], [2], [4])]), STRICT),
    ("text-without-tokenizer", lambda v: _pairs_task([("a b", "a c", " b", " c")]), STRICT),
    ("unequal-lengths", lambda v: _pairs_task([([1, 2, 3], [1, 4], [2], [4])]), STRICT),
    ("longer-than-context", lambda v: _pairs_task([([1] * 400, [2] * 400, [2], [4])]), STRICT),
    ("answer-is-wrong", lambda v: _pairs_task([([1, 2, 3], [1, 4, 3], [2], [2])]), STRICT),
    ("marks-beyond-prompt", lambda v: _task_with(marks=tuple({"a": 50, "b": 0} for _ in copy_task().pairs),
                                                 attention_scores=(("s", "a", "b"),)), STRICT),
]
TASK_PATHS: list[Bad] = [
    ("None", const(None), STRICT),
    ("int", const(3), STRICT),
    ("empty", const(""), STRICT),
    ("bytes", lambda v: os.fsencode(v), STRICT),
    ("list", lambda v: [v], STRICT),
    ("missing", const("/nonexistent/circuitkit-fuzz/pairs.jsonl"), STRICT),
    ("directory", lambda v: str(Path(v).parent), STRICT),
    ("nul-in-path", const("pairs\0.jsonl"), STRICT),
    ("name-too-long", const("x" * 300 + ".jsonl"), STRICT),
    ("dev-zero", const("/dev/zero"), STRICT),
    ("link-to-dev-zero", lambda v: bad_task_file("zero.jsonl", link="/dev/zero"), STRICT),
    ("fifo", lambda v: bad_task_file("pipe.jsonl", fifo=True), STRICT),
    ("65-MiB", lambda v: bad_task_file("big.jsonl", size=65 * 2**20), STRICT),
    ("txt-suffix", lambda v: bad_task_file("pairs.txt", "hello"), STRICT),
    ("empty-file", lambda v: bad_task_file("empty.jsonl", ""), STRICT),
    ("not-utf8", lambda v: bad_task_file("latin.jsonl", b"\xff\xfe{"), STRICT),
    ("200k-deep", lambda v: bad_task_file("deep.json", "[" * 200_000 + "]" * 200_000), STRICT),
    ("nan-token", lambda v: bad_task_file("nan.jsonl", '{"clean": [1, NaN], "corrupted": [1, 2], "answer": 2, '
                                                       '"wrong": 3}\n'), STRICT),
    ("float-ids", lambda v: bad_task_file("f.jsonl", '{"clean": [1.0, 2], "corrupted": [1, 2], "answer": 2, '
                                                     '"wrong": 3}\n'), STRICT),
    ("csv-short-row", lambda v: bad_task_file("s.csv", "clean,corrupted,answer,wrong\na,b,c\n"), STRICT),
    ("eap-huge-index", lambda v: bad_task_file("e.csv", "clean,corrupted,correct_idx,incorrect_idx\na,b,"
                                               + "9" * 5000 + ",3\n"), STRICT),
]

record(f"{TK}:TaskBatch", "built by Task.tokenize (fuzzed), which checks every id against the model")
record(f"{TK}:TaskCircuit", "result record of scan_task (built and checked by it)")
record(f"{TK}:TaskScan", "result record of scan_task (its save() is fuzzed)")
case(f"{TK}:Pair", lambda: {"clean": list(ROW[0]), "corrupted": list(ROW[1]), "answers": (2,), "wrongs": (4,)},
     extra_bad={"clean": PROMPTS, "corrupted": PROMPTS, "answers": ANSWERS, "wrongs": ANSWERS})
case(f"{TK}:Task", lambda: {"name": "copy", "pairs": copy_task().pairs, "metric": "logit_diff",
     "ablation": "corrupted", "description": "d", "marks": tuple({"a": 0, "b": 1} for _ in copy_task().pairs),
     "attention_scores": (("s", "a", "b"),)}, name="text", metric="option", ablation="option", description="text",
     extra_bad={
         "name": [("blank", const("  "), STRICT), ("two-lines", const("a\nb"), STRICT),
                  ("101-characters", const("x" * 101), STRICT)],
         "pairs": [("None", const(None), STRICT), ("empty", const(()), STRICT), ("list", lambda v: list(v), STRICT),
                   ("raw-tuples", const((ROW,)), STRICT), ("tuple-of-None", const((None,)), STRICT),
                   ("100001-pairs", lambda v: v[:1] * 100_001, STRICT)],
         "marks": [("None", const(None), STRICT), ("list", lambda v: list(v), STRICT),
                   ("wrong-length", lambda v: v[:1], STRICT), ("negative", lambda v: ({"a": -1, "b": 0},) * len(v),
                                                                STRICT),
                   ("bool", lambda v: ({"a": True, "b": 0},) * len(v), STRICT),
                   ("str-position", lambda v: ({"a": "0", "b": 0},) * len(v), STRICT),
                   ("not-dicts", lambda v: ((0, 1),) * len(v), STRICT),
                   ("missing-mark", lambda v: ({"a": 0},) * len(v), STRICT)],
         "attention_scores": [("None", const(None), STRICT), ("unknown-mark", const((("s", "a", "zz"),)), STRICT),
                              ("two-fields", const((("s", "a"),)), STRICT), ("str", const("s"), STRICT),
                              ("blank-name", const(((" ", "a", "b"),)), STRICT),
                              ("list", const([("s", "a", "b")]), STRICT)],
     })
case(f"{TK}:UserMetric", lambda: {"fn": lambda logits, batch: logits[:, -1, 0], "reads": "all"}, fn="callable",
     reads="option?")
case("circuitkit.graph.task:Task.from_pairs", lambda: {"pairs": [ROW, ([5, 6, 7], [5, 8, 7], [6], [8])], "name": "t",
     "metric": "prob_diff", "ablation": "mean", "description": ""}, name="text", metric="option", ablation="option",
     description="text", extra_bad={"pairs": PAIR_LISTS, "metric": [("alias-padded", const(" kl"), STRICT)]})
method("circuitkit.graph.task:Task.tokenize", copy_task, lambda: {"model_or_adapter": induction_model()},
       model_or_adapter="model-static",
       extra_bad={"model_or_adapter": [("vocab-too-small", lambda v: toy_from(random_weights(2, 2, 8, 4, d_vocab=8)),
                                        STRICT)]})
case(f"{TK}:load_task", lambda: {"path": task_file(), "name": "fuzz", "metric": "logit_diff",
     "ablation": "corrupted"}, name="text?", metric="option", ablation="option", extra_bad={"path": TASK_PATHS})
GENERATOR_NAMES: list[Bad] = [
    ("None", const(None), STRICT), ("int", const(3), STRICT), ("list", const(["ioi"]), STRICT),
    ("dict", const({}), STRICT), ("bytes", const(b"ioi"), STRICT), ("unknown", const("nonsense"), STRICT),
    ("empty", const(""), STRICT), ("upper-case", const("IOI"), STRICT), ("padded", const(" ioi "), STRICT),
    ("induction", const("induction"), STRICT),
]
case(f"{TK}:get_task", lambda: {"name_or_path": "ioi", "model": english(), "n": 2, "seed": 0}, model="model-static",
     n="size>=2?", seed="seed", extra_bad={"name_or_path": GENERATOR_NAMES})
for _name in ("ioi", "greater_than", "docstring"):
    case(f"{TK}:{_name}", lambda: {"model": english(), "n": 2, "seed": 1}, model="model-static", n="size>=2",
         seed="seed", extra_bad={"model": [("unknown-words-tokenizer", lambda v: bridge(), STRICT)]})
case(f"{TK}:repeated_tokens", lambda: {"model": induction_model(), "n": 2, "seed": 1, "block_len": 4, "n_repeats": 2,
                                      "corrupt_seed": 1, "ablation": "clean_mean"},
     model="model-static", n="size>=2", seed="seed", block_len="size>=2?", n_repeats="size>=2", corrupt_seed="seed",
     ablation="option")
CASES[f"{TK}:ioi"].extra_bad["templates"] = [
    ("empty", const(()), STRICT), ("str", const("When {A} and {B} went, {B} gave it to"), STRICT),
    ("None", const(None), STRICT), ("no-A", const(("{B} and {B} gave it to",)), STRICT),
    ("one-B", const(("When {A} and {B} went, Tom gave it to",)), STRICT),
    ("unknown-field", const(("When {A} and {B} went to {city}, {B} gave it to",)), STRICT),
    ("positional-field", const(("When {A} and {B} went to {0}, {B} gave it to",)), STRICT),
    ("attribute-field", const(("When {A.x} and {B} went, {B} gave it to",)), STRICT),
    ("unbalanced-brace", const(("When {A and {B} went, {B} gave it to",)), STRICT),
    ("int-entry", const((3,)), STRICT), ("101-templates", const(("When {A} and {B} went, {B} gave it to",) * 101),
                                        STRICT),
]
case(f"{TK}:scan_task", lambda: {"model": induction_model(), "task": copy_task(), "target": 0.8, "mlps": None,
     "mlp_nodes": False, "rank": "abs", "steps": 1, "edges": False, "device": "cpu", "name": None, "progress": None,
     "ablate": "top", "ablate_top": 2},
     positional=("model",), model="model-loss", named_kinds={"target": "real>0"}, mlps="bool?", mlp_nodes="bool",
     rank="option", steps="size>=1", edges="bool", device="device?", name="text?", progress="callable?",
     prepend_bos="bool?", target_on="option", ig_points="option", kv_edges="option", node_ranking="option",
     ablate="option", ablate_top="int>=1?",
     extra_bad={"task": [("None", const(None), STRICT), *TASKS],
                "holdout": [("one", const(1.0), STRICT), ("negative", const(-0.5), STRICT),
                            ("nan", const(float("nan")), STRICT), ("text", const("half"), STRICT)],
                "metric": [("accuracy", const("accuracy"), STRICT), ("a-class", const(int), STRICT)],
                "target": [("above-one", const(1.5), STRICT), ("zero", const(0.0), STRICT)],
                "steps": [("65", const(65), STRICT)],
                "name": [("blank", const("  "), STRICT), ("two-lines", const("a\nb"), STRICT)],
                "neuron_groups": [("zero", const(0), STRICT), ("bool", const(True), STRICT),
                                  ("float", const(2.0), STRICT), ("no-mlps", const(4), STRICT)],
                "node_types": [("names", const(["resid"]), STRICT), ("int", const(3), STRICT)]})
method(f"{TK}.scan:TaskScan.save", task_scan_result, lambda: {"out_dir": tmp_out_dir(), "png": False},
       out_dir="out_dir", png="bool")
record(f"{TK}:EdgeEffect", "result record of scan_task, edge_effects and path_patching (built by them)")
EDGE_NAMES: list[Bad] = [
    ("None", const(None), STRICT), ("empty", const([]), STRICT), ("int", const(3), STRICT),
    ("set", const({"1.0->logits"}), STRICT), ("dict", const({"1.0->logits": 1}), STRICT),
    ("no-arrow", const(["1.0 logits"]), STRICT), ("two-arrows", const(["0.0->1.0->logits"]), STRICT),
    ("unknown-sender", const(["7.0->logits"]), STRICT), ("unknown-receiver", const(["0.0->9.0:q"]), STRICT),
    ("backwards", const(["1.0->0.0:q"]), STRICT), ("same-layer-head", const(["1.0->1.0:q"]), STRICT),
    ("tuple-edge", const([((0, 0), (1, 0), "k")]), STRICT), ("bytes", const([b"1.0->logits"]), STRICT),
    ("nul", const(["1.0\0->logits"]), STRICT), ("10001-edges", const(["1.0->logits"] * 10_001), STRICT),
    ("endless", lambda v: itertools.repeat("1.0->logits"), STRICT),
]
case(f"{TK}:edge_effects", lambda: {"model": induction_model(), "task": copy_task(), "edges": ["1.0->logits",
     "0.0->1.0:k"], "metric": None, "mlps": None, "kv_edges": "grouped", "corrupt": "corrupted",
     "n_resamples": 50, "ci_level": 0.9, "prepend_bos": None, "device": "cpu", "progress": None},
     positional=("model",), model="model-loss", mlps="bool?", kv_edges="option", corrupt="option",
     n_resamples="size>=2",
     ci_level="real>0", prepend_bos="bool?", device="device?", progress="bool?",
     extra_bad={"task": [("None", const(None), STRICT), *TASKS], "edges": EDGE_NAMES,
                "metric": [("accuracy", const("accuracy"), STRICT), ("a-class", const(int), STRICT)],
                "ci_level": [("one", const(1.0), STRICT), ("above-one", const(1.5), STRICT)]})


@cache
def saved_task_scan_dir() -> str:
    """The task scan saved once, for TaskScan.load."""
    out = tmp_out_dir()
    task_scan_result().save(out)
    return out


case(f"{TK}.scan:TaskScan.load", lambda: {"path": saved_task_scan_dir()}, path="text",
     target=lambda: __import__("circuitkit.tasks", fromlist=["TaskScan"]).TaskScan.load,
     extra_bad={"path": [("missing-dir", const("/nonexistent/scan-dir"), STRICT),
                         ("not-a-scan", lambda v: _existing_file(v), STRICT),
                         ("an-induction-scan", lambda v: saved_scan_dir(), STRICT)]})
method(f"{TK}.scan:TaskScan.table", task_scan_result, lambda: {"sort": "score"}, sort="option?")
method(f"{TK}.scan:TaskScan.to_pandas", task_scan_result, lambda: {"sort": "dla"}, sort="option?")
method(f"{TK}.scan:TaskScan.searched", task_scan_result, lambda: {"key": "edge_search"}, key="option")
method(f"{TK}.scan:TaskScan.top", task_scan_result, lambda: {"score": "dla", "k": 3}, score="option?",
       k="int>=1")

# ``scan(model, task=...)``: the bad tasks above, plus the names and paths scan takes, with ``tokens=None`` (a task
# and a batch together are refused on their own) on the hand-built model.
CASES["circuitkit:scan"].extra_bad["task"] = [
    *TASKS, ("unknown-name", const("nonsense"), STRICT), ("empty", const(""), STRICT), ("bytes", const(b"ioi"), STRICT),
    ("padded-induction", const(" induction "), STRICT), ("ioi-without-tokenizer", const("ioi"), STRICT),
    ("missing-path", const(Path("/nonexistent/circuitkit-fuzz/pairs.jsonl")), STRICT),
    ("dev-zero", const("/dev/zero"), STRICT), ("directory", const("/tmp"), STRICT),
    ("int", const(3), STRICT),
]
CASES["circuitkit:scan"].context["task"] = lambda: {
    "model": induction_model(), "tokens": None, "task": copy_task(),
    # the induction scan's own settings at their defaults: a task scan refuses any other value of them
    "ablate_top": 8, "top_k": 5, "circuit": True}

# --- circuitkit.report
R = "circuitkit.report"
case(f"{R}:save", lambda: {"scan": scan(), "out_dir": tmp_out_dir(), "png": False}, scan="scan", out_dir="out_dir",
     png="bool")
case(f"{R}:scan_json", lambda: {"scan": scan()}, scan="scan")
case(f"{R}:build_report", lambda: {"scan": scan(), "compress": True}, scan="scan", compress="bool")
case(f"{R}:summary_html", lambda: {"scan": scan()}, scan="scan")

# --- methods
HW = "circuitkit.weights:HeadWeights"
case(f"{HW}.from_tensors", lambda: {"tensors": {k: v for k, v in weights().tensors().items()}}, tensors="heads",
     extra_bad={"tensors": [("missing-W_O", lambda v: {k: t for k, t in v.items() if k != "W_O"}, STRICT),
                            ("unknown-key", lambda v: {**v, "W_X": v["W_Q"]}, STRICT),
                            ("nan-W_Q", lambda v: {**v, "W_Q": _poison(v["W_Q"], math.nan)}, STRICT),
                            ("int-W_K", lambda v: {**v, "W_K": v["W_K"].long()}, STRICT),
                            ("numpy-values", lambda v: {k: t.numpy() for k, t in v.items()}, LENIENT),
                            ("list-values", lambda v: {k: t.tolist() for k, t in v.items()}, LENIENT)]})
case(f"{HW}.from_model", lambda: {"model": toy(), "embeddings": False}, model="weights", embeddings="bool")
method(f"{HW}.to", weights, lambda: {"device": "cpu", "dtype": torch.float64}, device="device?", dtype="dtype")
method(f"{HW}.layers", weights, lambda: {"layers": [1]}, layers="heads", extra_bad={"layers": ENDLESS_INTS})
method(f"{HW}.per_query_head", weights, lambda: {"name": "W_K"}, name="option")
HS = "circuitkit.detect.scores:HeadScores"
method(f"{HS}.top", head_scores_result, lambda: {"name": "induction", "k": 2}, name="option", k="int>=1")
method(f"{HS}.patterns_for", head_scores_result, lambda: {"layer": 1, "head": 1}, layer="int>=0", head="int>=0",
       extra_bad={"layer": [("out-of-range", const(2), STRICT)], "head": [("out-of-range", const(2), STRICT)]})
method(f"{HS}.to_dataframe", head_scores_result, lambda: {"sort_by": "previous_token"}, sort_by="option")
method("circuitkit.scan_types:HeadEffects.top", effects, lambda: {"k": 2, "absolute": True}, k="int>=1",
       absolute="bool")
method("circuitkit.scan_types:Scan.top", scan, lambda: {"score": "induction", "k": 2}, score="option?", k="int>=1")
method("circuitkit.scan_types:Scan.save", scan, lambda: {"out_dir": tmp_out_dir(), "png": False},
       out_dir="out_dir", png="bool")
case("circuitkit.scan_types:Scan.load", lambda: {"path": saved_scan_dir()}, path="text",
     target=lambda: __import__("circuitkit").Scan.load,
     extra_bad={"path": [("missing-dir", const("/nonexistent/scan-dir"), STRICT),
                         ("not-a-scan", lambda v: _existing_file(v), STRICT)]})
method("circuitkit.scan_types:Scan.table", scan, lambda: {"sort": "induction"}, sort="option?")
method("circuitkit.scan_types:Scan.to_pandas", scan, lambda: {"sort": "previous_token"}, sort="option?")
method("circuitkit.detect.tokens:RepeatedTokens.build", spec, lambda: {"model": toy(), "device": "cpu"},
       model="model-static", device="device?")
method("circuitkit.detect.tokens:TokenBatch.targets", batch, lambda: {"name": "induction"}, name="option",
       extra_bad={"name": [("weight-score", const("copying"), STRICT)]})
AOM = "circuitkit.models.toy:AttentionOnlyModel"
_BAD_HOOK_RESULTS = {  # what a hook may wrongly return in place of its activation
    "nan": lambda t, hook: torch.full_like(t, math.nan),
    "inf": lambda t, hook: t * math.inf,
    "int64": lambda t, hook: t.long(),
    "float64": lambda t, hook: t.double(),
    "bool": lambda t, hook: t > 0,
    "complex": lambda t, hook: t.to(torch.complex64),
    "meta": lambda t, hook: torch.empty_like(t, device="meta"),
    "list": lambda t, hook: t.tolist(),
    "wrong-shape": lambda t, hook: t[:1],
}
method(f"{AOM}.run_with_hooks", toy, lambda: {"tokens": batch().tokens, "fwd_hooks": [], "start_at_layer": None},
       tokens="token_ids", fwd_hooks="heads", start_at_layer="int>=0?",
       extra_bad={"start_at_layer": [("past-last-layer", const(5), STRICT)],
                  "fwd_hooks": [(f"hook-returns-{label}", const([("blocks.0.attn.hook_z", make)]), STRICT)
                                for label, make in _BAD_HOOK_RESULTS.items()]})
method(f"{AOM}.run_with_cache", toy, lambda: {"tokens": batch().tokens, "names_filter": [  # not the masked scores
           "hook_embed", "blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post"]},
       tokens="token_ids",
       extra_bad={"names_filter": [("int", const(5), STRICT), ("list-of-int", const([5]), STRICT),
                                   ("bytes", const(b"hook_embed"), STRICT), ("unknown", const(["nope"]), STRICT)]})
method(f"{AOM}.forward", toy, lambda: {"tokens": batch().tokens}, tokens="token_ids")
method(f"{AOM}.with_attention", toy, lambda: {"attention": "hard"}, attention="option")
method(f"{AOM}.to", toy, lambda: {"device": "cpu"}, device="device")



VALID_HERE: dict[str, dict[str, dict[str, str]]] = {
    "circuitkit.handbuilt:QK": {"b_Q": {"rank-minus-1": "the generator returns a 1-D tensor unchanged: valid"}},
    "circuitkit.theory:softmax_jacobian": {"z": {"rank-minus-1": "the generator returns a 1-D tensor unchanged"}},
    "circuitkit.handbuilt:key_bias_qk": {"key": {"other-d_model": "no second subspace to compare widths with"}},
    "circuitkit.handbuilt:previous_token_qk": {"positions": {"other-d_model": "no second subspace to compare with"}},
    **{f"circuitkit:{name}": {"values": {"nan": "NaN means not measured (documented)",
                                          "int-dtype": "an int quantity is a quantity (held as float32)"}}
       for name in ("HeadValues", "EdgeValues")},
    "circuitkit.circuits:EdgeSpec": {
        "dst": {"layer-out-of-range": "a legal head without a model; parse_edges checks it against the model"},
        "src": {"head-out-of-range": "a legal head without a model; parse_edges checks it against the model"},
    },
    "circuitkit.theory:layernorm_output_norm": {
        "x": {"rank-minus-1": "any leading *batch dims (docstring)", "rank-plus-1": "any leading *batch dims"},
    },
    "circuitkit.theory:rope": {
        "x": {"rank-minus-1": "any leading *batch dims (docstring)", "rank-plus-1": "any leading *batch dims"},
    },
    "circuitkit.theory:self_attention": {"x": {"rank-plus-1": "any leading *batch dims (docstring)"}},
    "circuitkit.theory:receptive_field": {"n_layers": {"int0": "0 layers see 1 position, by definition"}},
    "circuitkit.theory:sinusoidal_offset_map": {"offset": {"int-1": "negative offsets are documented: M_-k = M_k^T"}},
    "circuitkit.factored:Factored.__rmatmul__": {"other": {"wrong-rows": "other @ self needs only its columns to "
                                                                        "match: [5, 8] @ [8, 8] is a valid product"}},
    "circuitkit.viz:attention_heads": {"head_names": {"None": "head_names is optional (default: 'layer.head')"}},
    **{f"circuitkit.tasks:{name}": {"model": {
        "module-nan-weight": "a generator reads the model's tokenizer only (scan_task refuses the weights)",
        "module-inf-weight": "a generator reads the model's tokenizer only (scan_task refuses the weights)",
    }} for name in ("get_task", "ioi", "greater_than", "docstring")},
    "circuitkit.tasks:repeated_tokens": {"model": {
        "module-nan-weight": "the generator reads the model's vocabulary only (scan_task refuses the weights)",
        "module-inf-weight": "the generator reads the model's vocabulary only (scan_task refuses the weights)",
    }},
    "circuitkit.graph.task:Task.tokenize": {"model_or_adapter": {
        "module-nan-weight": "tokenizing reads the vocabulary and tokenizer only (scan_task refuses the weights)",
        "module-inf-weight": "tokenizing reads the vocabulary and tokenizer only (scan_task refuses the weights)",
    }},
}
"""Generated "bad" values that are valid for that callable, with the reason: not thrown as bad inputs."""

# ---------------------------------------------------------------------------------------------------- checks


def non_finite(value: Any, path: str = "result", depth: int = 0) -> str | None:
    """The path of the first NaN/inf inside ``value`` (tensors, arrays, numbers, containers, dataclasses)."""
    if depth > 6:
        return None
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and value.numel():
            return None if bool(torch.isfinite(value).all()) else path
        return None
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc" and value.size:
            return None if bool(np.isfinite(value).all()) else path
        return None
    if isinstance(value, (float, complex, np.floating)):
        return None if np.isfinite(value) else path
    if isinstance(value, Mapping):
        items = list(value.items())[:200]
        for k, v in items:
            found = non_finite(v, f"{path}[{k!r}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:200]):
            found = non_finite(v, f"{path}[{i}]", depth + 1)
            if found:
                return found
        return None
    name = type(value).__name__
    if name == "HeadEffects" and value.exact is not None:  # NaN marks heads that were not ablated (documented)
        return non_finite(value.effect[value.exact], f"{path}.effect[exact]", depth + 1) or (
            None if bool((value.effect[~value.exact].isnan()).all()) else f"{path}.effect[~exact] (expected NaN)")
    if name == "Scan" and value.ablation is not None and "ablation" in value.intervals:
        # the ablation's interval is NaN where the head was not ablated, as its effect is (documented)
        exact = value.ablation.exact
        low, high = value.intervals["ablation"]
        if not bool(low[~exact].isnan().all() and high[~exact].isnan().all()):
            return f"{path}.intervals['ablation'][~exact] (expected NaN)"
        rest = replace(value, intervals={**value.intervals, "ablation": (low[exact], high[exact])})
        return non_finite(rest.intervals, f"{path}.intervals", depth + 1) or next(
            (found for f in fields(value) if f.name != "intervals"
             for found in [non_finite(getattr(value, f.name), f"{path}.{f.name}", depth + 1)] if found), None)
    if name == "SingleHeads":  # a task's heads patched alone: exact is NaN where a head was not patched (documented)
        patched = torch.zeros_like(value.exact, dtype=torch.bool)
        for head in value.heads:
            patched[head] = True
        if not bool(value.exact[~patched].isnan().all()):
            return f"{path}.exact[not patched] (expected NaN)"
        return non_finite(value.exact[patched], f"{path}.exact[patched]", depth + 1) or next(
            (found for f in fields(value) if f.name != "exact"
             for found in [non_finite(getattr(value, f.name), f"{path}.{f.name}", depth + 1)] if found), None)
    if name in ("HeadValues", "EdgeValues"):  # NaN marks "not measured" and non-edges (documented); never inf
        return f"{path}.values (infinite)" if bool(value.values.isinf().any()) else None
    if name == "EdgeAttribution":  # NaN marks src layer >= dst layer, which are not edges (documented)
        layers = value.scores.shape[0]
        edge = torch.arange(layers)[:, None, None, None, None] < torch.arange(layers)[None, None, :, None, None]
        edge = edge.expand_as(value.scores)
        return non_finite(value.scores[edge], f"{path}.scores[edges]", depth + 1)
    if is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            found = non_finite(getattr(value, f.name), f"{path}.{f.name}", depth + 1)
            if found:
                return found
    return None
