"""The offline HTML report of a scan: one self-contained file that opens with the network off.

Why this module exists: CircuitsVis and plotly both inline their JavaScript once *per view* (``local_src``,
``to_html(include_plotlyjs=True)``) or load it from a CDN; a report with twenty views would be tens of
megabytes, or would not open offline. Here each library is inlined exactly once and every view is stored as
data (plotly figure JSON, CircuitsVis element + props) that one small loader script draws.

Layout of the file (:func:`build_report`):

- each library (plotly.js, the CircuitsVis bundle taken from ``RenderedHTML.local_src``) once, gzip-compressed
  and base64-encoded in a ``<script type="application/x-circuitkit-gzip-base64">`` data block, unpacked in the
  browser with ``DecompressionStream`` (Chromium >= 80, Firefox >= 113, Safari >= 16.4) — this keeps a
  12 x 12-head report under 5 MB; ``compress=False`` inlines them as plain scripts instead;
- each view as a ``<div class="ck-view">`` plus a ``<script type="application/json">`` data block;
- every string from the model (token strings, names) HTML-escaped in text and ``<``/``>``/``&``-escaped as
  ``\\u003c``... inside JSON, so no token can close a script or inject markup;
- no network URL anywhere the browser would load (no ``src=``/``href=``/``url(``/``import`` of http(s)).

The output is a pure function of the results: no timestamps, deterministic element ids, so the same scan
gives the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxtyping import Float
from torch import Tensor

from circuitkit.errors import CircuitkitError, describe

MAX_REPORT_BYTES = 5 * 2**20
# attention probabilities shown to 4 decimals: invisible on screen, halves the report's pattern data
PATTERN_DECIMALS = 4
GZIP_MIME = "application/x-circuitkit-gzip-base64"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--enable-unsafe-swiftshader",  # without it (or with --disable-gpu) the CircuitsVis WebGL canvases stay blank
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
)


@dataclass(frozen=True)
class ModelSummary:
    """What the report says about the model: its name and shape."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int | None = None
    n_ctx: int | None = None
    n_kv_heads: int | None = None
    attn_only: bool | None = None

    @classmethod
    def from_model(cls, model: Any, name: str) -> ModelSummary:
        """Read the shape from ``model.cfg`` (TransformerLens bridge or the circuitkit toy model)."""
        cfg = getattr(model, "cfg", None)
        if cfg is None:
            raise CircuitkitError(f"ModelSummary.from_model: given {describe(model)}; expected a model with .cfg.")
        n_kv = getattr(cfg, "n_key_value_heads", None)
        return cls(
            name=name,
            n_layers=int(cfg.n_layers),
            n_heads=int(cfg.n_heads),
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            d_vocab=_int_or_none(getattr(cfg, "d_vocab", None)),
            n_ctx=_int_or_none(getattr(cfg, "n_ctx", None)),
            n_kv_heads=_int_or_none(n_kv),
            attn_only=getattr(cfg, "attn_only", None),
        )


@dataclass(frozen=True)
class ScanResults:
    """Everything a report shows, already computed (the report computes nothing about the model).

    - ``head_scores``: score name -> ``[layer, head]`` (e.g. a :class:`~circuitkit.detect.HeadScores`);
    - ``tokens``, ``patterns``: the repeated sequence's token strings and ``(layer, head) -> [pos, pos]``
      attention patterns of the heads to show;
    - ``composition``: mode (``"Q"``, ``"K"``, ``"V"``) -> ``[src_layer, src_head, dst_layer, dst_head]``,
      ``baselines``: mode -> random-baseline mean, ``edges``: mode -> top edges (``circuitkit.top_edges``);
    - ``spectra``: circuit (``"OV"``, ``"QK"``) -> ``[layer, head, k]`` singular values;
    - ``ablation``: an :class:`~circuitkit.detect.AblationEffects`-like object (``clean_loss``, ``loss``,
      ``delta``); ``induction_loss``: an ``InductionLoss``-like object (``first_half``, ``repeated_half``);
    - ``settings``: the scan's options, shown verbatim (keep them free of timestamps).
    """

    model: ModelSummary
    head_scores: Mapping[str, Float[Tensor, "layer head"]]
    tokens: Sequence[str] = ()
    patterns: Mapping[tuple[int, int], Float[Tensor, "pos pos"]] = field(default_factory=dict)
    composition: Mapping[str, Float[Tensor, "src_layer src_head dst_layer dst_head"]] = field(default_factory=dict)
    baselines: Mapping[str, float] = field(default_factory=dict)
    edges: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    spectra: Mapping[str, Float[Tensor, "layer head k"]] = field(default_factory=dict)
    ablation: Any | None = None
    induction_loss: Any | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    top_k: int = 5

    def __post_init__(self) -> None:
        shape = (self.model.n_layers, self.model.n_heads)
        if not isinstance(self.head_scores, Mapping) or not self.head_scores:
            raise CircuitkitError(
                f"ScanResults.head_scores: given {describe(self.head_scores)}; expected a non-empty mapping "
                "score name -> [layer, head] tensor."
            )
        for name, value in self.head_scores.items():
            if not isinstance(value, Tensor) or tuple(value.shape) != shape:
                raise CircuitkitError(
                    f"ScanResults.head_scores[{name!r}]: given {describe(value)}; expected a [layer, head] tensor "
                    f"of shape {shape} (the model summary's)."
                )
        for mode, value in self.composition.items():
            if not isinstance(value, Tensor) or tuple(value.shape) != shape + shape:
                raise CircuitkitError(
                    f"ScanResults.composition[{mode!r}]: given {describe(value)}; expected shape {shape + shape}."
                )
        if self.patterns and any(tuple(p.shape) != (len(self.tokens),) * 2 for p in self.patterns.values()):
            raise CircuitkitError(
                f"ScanResults.patterns: given shapes {sorted({tuple(p.shape) for p in self.patterns.values()})}; "
                f"expected [pos, pos] with pos = len(tokens) = {len(self.tokens)}."
            )
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise CircuitkitError(f"ScanResults.top_k: given {self.top_k!r}; expected a positive int.")


# ---------------------------------------------------------------------------------------------- JSON
def top_heads(scores: Float[Tensor, "layer head"], k: int) -> list[tuple[tuple[int, int], float]]:
    """The ``k`` highest-scoring heads, descending (ties by ``(layer, head)`` order; NaN scores last)."""
    flat = scores.detach().float().cpu().reshape(-1).tolist()
    n_heads = scores.shape[1]

    def key(i: int) -> tuple[bool, float, int]:
        undefined = math.isnan(flat[i])
        return undefined, 0.0 if undefined else -flat[i], i

    order = sorted(range(len(flat)), key=key)[:k]
    return [((i // n_heads, i % n_heads), float(flat[i])) for i in order]


def scores_json(results: ScanResults) -> dict[str, Any]:
    """The machine-readable scan (``scores.json``): scores per head, rankings, edges, ablation. Deterministic."""
    from circuitkit import __version__

    def grid(tensor: Tensor) -> list[list[float]]:
        return [[_finite(v) for v in row] for row in tensor.detach().double().cpu().tolist()]

    out: dict[str, Any] = {
        "circuitkit_version": __version__,
        "model": {k: v for k, v in vars(results.model).items()},
        "settings": dict(results.settings),
        "head_scores": {name: grid(value) for name, value in results.head_scores.items()},
        "top_heads": {
            name: [{"head": f"{ly}.{h}", "layer": ly, "index": h, "score": _finite(s)}
                   for (ly, h), s in top_heads(value, results.top_k)]
            for name, value in results.head_scores.items()
        },
        "composition": {
            mode: {
                "baseline": _finite(results.baselines.get(mode)),
                "top_edges": [
                    {"src": f"{e.src[0]}.{e.src[1]}", "dst": f"{e.dst[0]}.{e.dst[1]}", "score": _finite(e.score)}
                    for e in results.edges.get(mode, ())
                ],
            }
            for mode in sorted(set(results.composition) | set(results.edges))
        },
    }
    if results.ablation is not None:
        out["ablation"] = {
            "clean_loss": _finite(results.ablation.clean_loss),
            "loss": grid(results.ablation.loss),
            "delta": grid(results.ablation.delta),
        }
    if results.induction_loss is not None:
        out["induction_loss"] = {
            "first_half": _finite(results.induction_loss.first_half),
            "repeated_half": _finite(results.induction_loss.repeated_half),
        }
    return out


# ---------------------------------------------------------------------------------------------- HTML
def build_report(results: ScanResults, *, title: str | None = None, compress: bool = True) -> str:
    """The report as one HTML string (see the module docstring for its layout)."""
    from circuitkit import __version__

    page = _Page()
    name = results.model.name
    page.raw(f"<h1>{_esc(title or f'circuitkit report: {name}')}</h1>")
    page.raw('<p id="ck-status" class="note">Drawing the figures&hellip; (needs JavaScript)</p>')
    page.section("Model", _summary_table(results))
    _top_heads_section(page, results)
    _head_score_section(page, results)
    _attention_section(page, results)
    _composition_section(page, results)
    _spectra_section(page, results)
    _ablation_section(page, results)
    page.raw(f'<footer class="note">circuitkit {_esc(__version__)}</footer>')
    return page.render(title or f"circuitkit report: {name}", compress=compress)


def write_report(results: ScanResults, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Write :func:`build_report` to ``path`` (UTF-8) and return it."""
    path = Path(path)
    text = build_report(results, **kwargs)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise CircuitkitError(
            f"write_report: cannot write {str(path)!r} ({error.strerror}); expected a writable file path."
        ) from error
    return path


class _Page:
    """Collects HTML fragments, views (figure/CircuitsVis data blocks) and the libraries they need."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.n_views = 0
        self.libraries: dict[str, str] = {}

    def raw(self, fragment: str) -> None:
        self.parts.append(fragment)

    def section(self, heading: str, body: str = "") -> None:
        self.parts.append(f"<h2>{_esc(heading)}</h2>{body}")

    def figure(self, figure: Any, label: str) -> None:
        import plotly.io as pio

        if "plotly" not in self.libraries:
            from plotly.offline import get_plotlyjs

            self.libraries["plotly"] = get_plotlyjs()
        spec = json.loads(pio.to_json(figure, validate=False, pretty=False))
        spec["layout"].pop("template", None)  # one shared template instead of ~10 kB per figure
        self._view("plotly", spec, label)

    def circuitsvis(self, rendered: Any, label: str) -> None:
        from circuitkit.viz.attention import parse_rendered

        parsed = parse_rendered(rendered)
        if "circuitsvis" not in self.libraries:
            bundle = "\n".join(
                line for line in parsed.bundle.splitlines() if not line.startswith("//# sourceMappingURL")
            )
            self.libraries["circuitsvis"] = bundle
        props = dict(parsed.props)
        if "attention" in props:
            props["attention"] = _round_nested(props["attention"], PATTERN_DECIMALS)
        self._view("circuitsvis", {"element": parsed.element, "props": props}, label)

    def _view(self, kind: str, spec: Any, label: str) -> None:
        view_id = f"ck-view-{self.n_views}"
        self.n_views += 1
        self.parts.append(
            f'<div class="ck-view ck-{kind}" id="{view_id}" data-kind="{kind}" data-label="{_esc(label)}"></div>'
            f'<script type="application/json" id="{view_id}-data">{_script_json(spec)}</script>'
        )

    def render(self, title: str, *, compress: bool) -> str:
        libraries = []
        for name, code in self.libraries.items():
            if compress:
                packed = base64.b64encode(gzip.compress(code.encode("utf-8"), compresslevel=9, mtime=0))
                libraries.append(f'<script type="{GZIP_MIME}" id="ck-lib-{name}">{packed.decode("ascii")}</script>')
            else:
                libraries.append(f'<script id="ck-lib-{name}">{_script_code(code)}</script>')
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{_CSS}</style>"
            f'<script type="application/json" id="ck-template">{_script_json(_TEMPLATE)}</script>'
            "</head><body>\n" + "\n".join(self.parts) + "\n" + "\n".join(libraries)
            + f"\n<script>{_LOADER}</script>\n</body></html>\n"
        )


def _summary_table(results: ScanResults) -> str:
    rows = [(key, value) for key, value in vars(results.model).items() if value is not None]
    rows += [(key, value) for key, value in results.settings.items()]
    return _table(["", ""], [[key, str(value)] for key, value in rows], show_header=False)


def _top_heads_section(page: _Page, results: ScanResults) -> None:
    k = results.top_k
    names = list(results.head_scores)
    header = ["rank"] + [f"{name}" for name in names]
    ranked = {name: top_heads(results.head_scores[name], k) for name in names}
    rows = []
    for rank in range(min(k, results.model.n_layers * results.model.n_heads)):
        row = [str(rank + 1)]
        for name in names:
            (layer, head), score = ranked[name][rank]
            row.append(f"{layer}.{head} ({score:.3f})")
        rows.append(row)
    page.section(f"Top {k} heads per score", _table(header, rows))


def _head_score_section(page: _Page, results: ScanResults) -> None:
    from circuitkit.viz import head_score_heatmap

    page.section("Head scores (layer x head)")
    for name, scores in results.head_scores.items():
        page.figure(head_score_heatmap(scores, title=name), f"head-score-{name}")


def _attention_section(page: _Page, results: ScanResults) -> None:
    if not results.patterns:
        return
    from circuitkit.viz import attention_heads

    page.section(
        "Attention patterns on a repeated sequence",
        '<p class="note">Top heads; click a thumbnail to enlarge. Rows are queries, columns keys.</p>',
    )
    page.circuitsvis(attention_heads(dict(results.patterns), list(results.tokens)), "attention-heads")
    tokens = " ".join(f"<code>{_esc(token)}</code>" for token in results.tokens)
    page.raw(f"<details><summary>token strings ({len(results.tokens)})</summary><p>{tokens}</p></details>")


def _composition_section(page: _Page, results: ScanResults) -> None:
    if not results.composition and not results.edges:
        return
    from circuitkit.viz import composition_graph, composition_heatmap

    page.section("Composition between heads")
    for mode, scores in results.composition.items():
        baseline = results.baselines.get(mode)
        page.figure(composition_heatmap(scores, baseline=baseline, mode=mode), f"composition-{mode}")
        edges = results.edges.get(mode, ())
        if edges:
            rows = [[e.name if hasattr(e, "name") else f"{e.src} -> {e.dst}", f"{float(e.score):.4f}"] for e in edges]
            caption = f"Top {mode}-composition edges" + (
                "" if baseline is None else f" (random baseline {float(baseline):.4f})"
            )
            page.raw(f"<h3>{_esc(caption)}</h3>" + _table(["edge", "score"], rows))
    if results.edges:
        figure = composition_graph(
            dict(results.edges), n_layers=results.model.n_layers, n_heads=results.model.n_heads
        )
        page.figure(figure, "composition-graph")


def _spectra_section(page: _Page, results: ScanResults) -> None:
    if not results.spectra:
        return
    from circuitkit.viz import singular_value_spectra

    page.section("QK / OV singular values")
    for circuit, sigma in results.spectra.items():
        page.figure(singular_value_spectra(sigma, circuit), f"spectra-{circuit}")


def _ablation_section(page: _Page, results: ScanResults) -> None:
    if results.ablation is None and results.induction_loss is None:
        return
    from circuitkit.viz import head_score_heatmap

    page.section("Confirmation by ablation")
    if results.induction_loss is not None:
        loss = results.induction_loss
        page.raw(
            f"<p>Loss on the first half {float(loss.first_half):.4f}, on the repeated half "
            f"{float(loss.repeated_half):.4f}: in-context copying lowers the repeated half.</p>"
        )
    if results.ablation is not None:
        ablation = results.ablation
        page.raw(
            f"<p>Clean repeated-half loss {float(ablation.clean_loss):.4f}. Each cell: the rise in that loss when "
            "the head is ablated.</p>"
        )
        page.figure(
            head_score_heatmap(ablation.delta, title="loss rise when ablated", colorscale="RdBu_r", zmid=0.0),
            "ablation-delta",
        )
        rows = [[f"{ly}.{h}", f"{d:+.4f}"] for (ly, h), d in top_heads(ablation.delta, results.top_k)]
        page.raw(_table(["head", "loss rise"], rows))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, show_header: bool = True) -> str:
    head = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr>" if show_header else ""
    body = "".join("<tr>" + "".join(f"<td>{_esc(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


# ---------------------------------------------------------------------------------------------- helpers
def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _script_json(value: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>``, ``&`` escaped as ``\\u00XX`` (still valid JSON)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _script_code(code: str) -> str:
    """JavaScript safe inside ``<script>``: ``</script`` cannot occur (``<\\/`` means the same in JS strings)."""
    if "<!--" in code:
        code = code.replace("<!--", "<\\!--")
    return code.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def _round_nested(value: Any, decimals: int) -> Any:
    if isinstance(value, list):
        return [_round_nested(v, decimals) for v in value]
    if isinstance(value, float):
        rounded = round(value, decimals)
        return 0 if rounded == 0 else rounded
    return value


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value.item() if isinstance(value, Tensor) else value)
    return value if math.isfinite(value) else None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def find_chromium() -> str | None:
    """The Chromium executable to use: ``$CIRCUITKIT_CHROMIUM``, else ``chromium`` on ``PATH``, else None."""
    candidate = os.environ.get("CIRCUITKIT_CHROMIUM")
    if candidate:
        return candidate if Path(candidate).exists() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def export_pngs(report: str | os.PathLike, out_dir: str | os.PathLike, *, scale: float = 2.0) -> list[Path]:
    """Render every plotly figure of a written report to ``out_dir/<label>.png`` with headless Chromium.

    Needs the ``chromium`` executable and the ``playwright`` package; raises :class:`CircuitkitError` if either
    is missing. All network requests are blocked while the page renders.
    """
    executable = find_chromium()
    if executable is None:
        raise CircuitkitError(
            "export_pngs: given no Chromium (none on PATH, CIRCUITKIT_CHROMIUM unset); expected a headless "
            "browser. Install it (Debian: apt-get install chromium) or skip the PNG export."
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        raise CircuitkitError(
            "export_pngs: the 'playwright' package is not installed; expected it for PNG export. "
            "pip install playwright (its browser download is not needed)."
        ) from error
    report, out_dir = Path(report).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page()
            page.route("http*://**", lambda route: route.abort())
            page.goto(report.as_uri())
            page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=60_000)
            images = page.evaluate(
                """async (scale) => {
                    const out = [];
                    for (const el of document.querySelectorAll('.ck-view[data-kind="plotly"]')) {
                        out.push([el.dataset.label, await Plotly.toImage(el, {format: 'png', scale})]);
                    }
                    return out;
                }""",
                scale,
            )
        finally:
            browser.close()
    for label, url in images:
        path = out_dir / f"{_slug(label)}.png"
        path.write_bytes(base64.b64decode(url.split(",", 1)[1]))
        written.append(path)
    return written


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "figure"


_TEMPLATE = {
    "layout": {
        "font": {"family": "system-ui, sans-serif", "size": 12, "color": "#222"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#f7f7f7",
        "xaxis": {"gridcolor": "#ffffff", "zeroline": False},
        "yaxis": {"gridcolor": "#ffffff", "zeroline": False},
        "hoverlabel": {"align": "left"},
    }
}

_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    "th{background:#eee}.note{color:#666}.ck-view{margin:1em 0}code{background:#f3f3f3;margin:0 2px}"
    "#ck-status.failed{color:#b00}"
)

# Unpacks the libraries, then draws each view from its JSON data block. Marks <html data-ck-ready> when done
# ("true") or failed ("error"), which the browser test and export_pngs wait for.
_LOADER = """
(function () {
  "use strict";
  var status = document.getElementById("ck-status");
  async function inflate(node) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream; rebuild the report with compress=False");
    }
    var binary = atob(node.textContent.trim());
    var bytes = new Uint8Array(binary.length);
    for (var i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  function run(code) {
    var script = document.createElement("script");
    script.textContent = code;
    document.head.appendChild(script);
  }
  async function main() {
    var packed = document.querySelectorAll('script[type="GZIP_MIME"]');
    for (var i = 0; i < packed.length; i++) run(await inflate(packed[i]));
    var template = JSON.parse(document.getElementById("ck-template").textContent);
    var views = document.querySelectorAll(".ck-view");
    for (var j = 0; j < views.length; j++) {
      var view = views[j];
      var spec = JSON.parse(document.getElementById(view.id + "-data").textContent);
      if (view.dataset.kind === "plotly") {
        spec.layout.template = template;
        const config = {displaylogo: false, responsive: true, displayModeBar: "hover"};
        await Plotly.newPlot(view, spec.data, spec.layout, config);
      } else {
        CircuitsVis.render(view.id, CircuitsVis[spec.element], spec.props);
      }
    }
    status.textContent = "";
    document.documentElement.dataset.ckReady = "true";
  }
  main().catch(function (error) {
    status.textContent = "Could not draw the figures: " + error;
    status.className = "note failed";
    document.documentElement.dataset.ckReady = "error";
    console.error(error);
  });
})();
""".replace("GZIP_MIME", GZIP_MIME)

__all__ = [
    "ModelSummary",
    "ScanResults",
    "build_report",
    "write_report",
    "scores_json",
    "top_heads",
    "export_pngs",
    "find_chromium",
    "CHROMIUM_FLAGS",
    "MAX_REPORT_BYTES",
]
