/* circuitkit report page script (shipped as a package asset, inlined once into report.html).
 *
 * Unpacks the binary blobs (gzip + base64, or base64), then draws from the page data (#ck-data):
 * the head table (sortable, filterable), the small-multiple heatmaps, the composition views (layer x layer
 * aggregate and a zoomable head x head view) and the head panel (#ck-detail: attention pattern, QK/OV spectra,
 * strongest edges). One selection links them: a table row, a heatmap cell, a composition cell or any element
 * with data-head="layer.head" selects that head. Strings from the data are written with textContent only.
 *
 * Attention patterns are drawn by CircuitsVis: its bundle (#ck-lib-circuitsvis, packed like the blobs) is run
 * once; the panel renders CircuitsVis.AttentionPattern of the selected head, #ck-cv-circuit renders
 * CircuitsVis.AttentionHeads of the circuit's heads (D.circuit_view), both from the pattern blob. Tokens are
 * made inert before CircuitsVis sees them (inertText: some of its elements write tokens with innerHTML, and its
 * canvases draw them as text), as circuitkit.viz.attention does. If the bundle fails to load, a plain canvas draws the patterns and #ck-status
 * says so (<html data-ck-circuitsvis="failed">).
 * Marks <html data-ck-ready="true"> when drawn (CircuitsVis charts included), "error" on failure (the browser
 * test and PNG export wait for it).
 */
(function () {
  "use strict";
  var GZIP = "application/x-circuitkit-gzip-base64";
  var D, L, H, N, cols, blobs = {}, selected = -1, rows = [], order = [];
  var sortKey = null, sortDir = -1, mode = null, win = null, aggregates = {};
  var tip;
  var CV = null, cvError = null, cvTokens = null;  // the CircuitsVis global once loaded, or why it did not load
  var CV_WAIT_MS = 3000;
  var CV_TOKEN_CHARS = 12;  // CircuitsVis prints every token on both axes: a long token would squeeze the matrix  // longest wait for a CircuitsVis chart to appear before the page counts as drawn

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function headName(i) { return Math.floor(i / H) + "." + (i % H); }
  function parseHead(text) {
    var m = /^(\d+)\.(\d+)$/.exec(text || "");
    if (!m || +m[1] >= L || +m[2] >= H) return -1;
    return +m[1] * H + +m[2];
  }
  function fmt(v, digits) { return v === null || v === undefined ? "" : v.toFixed(digits === undefined ? 3 : digits); }
  // a column's value as text: a flag column (c.flag: 1 or 0) reads "yes" or blank
  function cellText(c, v) { return c.flag ? (v ? "yes" : "") : fmt(v); }
  // a head's bootstrap interval in a column, as element attributes (a tooltip), or null where there is none
  function interval(c, i) {
    if (!c.ci_lo || c.ci_lo[i] === null || c.ci_hi[i] === null) return null;
    return {title: "interval " + fmt(c.ci_lo[i]) + " to " + fmt(c.ci_hi[i]) + " (bootstrap over the batch's sequences)"};
  }
  function dpr() { return Math.max(1, Math.min(2, window.devicePixelRatio || 1)); }

  // as circuitkit.viz.attention.inert_html_text: HTML element content that shows the text itself, in the page and
  // on CircuitsVis's canvases (a zero-width WORD JOINER after each "<" and "&": neither opens a tag or a reference)
  function inertText(text) {
    return String(text).replace(/&/g, "&\u2060").replace(/</g, "<\u2060");
  }

  async function unpack(node) {
    var binary = atob(node.textContent.trim()), n = binary.length, bytes = new Uint8Array(n);
    for (var i = 0; i < n; i++) bytes[i] = binary.charCodeAt(i);
    if (node.type !== GZIP) return bytes;
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream; rebuild the report with compress=False");
    }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // ------------------------------------------------------------------------------------------ colours
  // white at the neutral value (what a random head scores), red above it up to hi, blue below down to lo
  function tone(v, c) {
    if (v === null || v === undefined || isNaN(v)) return null;
    var t = v >= c.neutral ? (c.hi > c.neutral ? (v - c.neutral) / (c.hi - c.neutral) : 0)
                           : (c.neutral > c.lo ? -(c.neutral - v) / (c.neutral - c.lo) : 0);
    return Math.max(-1, Math.min(1, t));
  }
  function rgb(t) {
    if (t === null) return "#f1f1f1";
    var end = t >= 0 ? [178, 24, 43] : [33, 102, 172], a = Math.abs(t);
    return "rgb(" + end.map(function (e) { return Math.round(255 + (e - 255) * a); }).join(",") + ")";
  }
  function rgbArray(t) {
    var end = t >= 0 ? [178, 24, 43] : [33, 102, 172], a = Math.abs(t);
    return end.map(function (e) { return Math.round(255 + (e - 255) * a); });
  }

  function showTip(event, text) {
    tip.textContent = text;
    tip.style.display = "block";
    var x = event.clientX + 14, y = event.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth - 4) x = event.clientX - tip.offsetWidth - 10;
    if (y + tip.offsetHeight > window.innerHeight - 4) y = event.clientY - tip.offsetHeight - 10;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function sizeCanvas(canvas, w, h) {
    var r = dpr();
    canvas.width = Math.max(1, Math.round(w * r));
    canvas.height = Math.max(1, Math.round(h * r));
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return ctx;
  }

  // ------------------------------------------------------------------------------------------ head table
  function buildTable() {
    var table = $("ck-table");
    if (!table) return;
    table.tHead.textContent = "";  // the plain table written for readers without JavaScript
    table.tBodies[0].textContent = "";
    var tr = el("tr");
    [{key: "head", short: "head", description: "layer.head"}].concat(cols).forEach(function (c) {
      var th = el("th", {"data-col": c.key, title: c.description, tabindex: "0", scope: "col"}, c.short);
      th.addEventListener("click", function () { sortBy(c.key); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortBy(c.key); });
      tr.appendChild(th);
    });
    table.tHead.appendChild(tr);
    var fragment = document.createDocumentFragment();
    for (var i = 0; i < N; i++) {
      var row = el("tr", {"data-head": headName(i), "data-i": String(i)});
      row.appendChild(el("th", {scope: "row"}, headName(i)));
      for (var j = 0; j < cols.length; j++) {
        var c = cols[j], v = c.values[i], t = tone(v, c), td = el("td", interval(c, i), cellText(c, v));
        if (t !== null) td.style.background = rgb(t);
        if (t !== null && Math.abs(t) > 0.55) td.style.color = "#fff";
        if (c.topSet[i]) td.className = "top";
        row.appendChild(td);
      }
      fragment.appendChild(row);
      rows.push(row);
      order.push(i);
    }
    table.tBodies[0].appendChild(fragment);
    $("ck-filter").addEventListener("input", applyFilter);
    applyFilter();
  }

  function sortBy(key) {
    if (sortKey === key) sortDir = -sortDir; else sortDir = key === "head" ? 1 : -1;
    sortKey = key;
    var column = cols.filter(function (c) { return c.key === key; })[0];
    order.sort(function (a, b) {
      if (!column) return sortDir * (a - b);
      var x = column.values[a], y = column.values[b];
      var xm = x === null, ym = y === null;
      if (xm || ym) return xm === ym ? a - b : (xm ? 1 : -1);  // blanks last in either direction
      if (column.abs) { x = Math.abs(x); y = Math.abs(y); }  // c.abs: ranked by size, either sign
      return x === y ? a - b : sortDir * (x - y);
    });
    var body = $("ck-table").tBodies[0], fragment = document.createDocumentFragment();
    order.forEach(function (i) { fragment.appendChild(rows[i]); });
    body.appendChild(fragment);
    Array.prototype.forEach.call($("ck-table").tHead.rows[0].cells, function (th) {
      if (th.dataset.col === key) th.setAttribute("aria-sort", sortDir < 0 ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
  }

  // filter syntax, words separated by spaces: "3" or "3." (layer 3), "3.4" (head), "top" (a top head of any
  // column), "induct>0.5" / "attr<-0.1" (a column by its short name). Heads and layers are alternatives (or);
  // everything else must hold as well (and).
  function compileFilter(text) {
    var heads = [], tests = [], bad = [];
    text.trim().split(/\s+/).filter(Boolean).forEach(function (word) {
      var m;
      if ((m = /^(\d+)\.(\d+)$/.exec(word))) heads.push(function (i) { return i === +m[1] * H + +m[2]; });
      else if ((m = /^(\d+)\.?$/.exec(word))) heads.push(function (i) { return Math.floor(i / H) === +m[1]; });
      else if (word === "top") tests.push(function (i) { return cols.some(function (c) { return c.topSet[i]; }); });
      else if ((m = /^([A-Za-z_][\w-]*)(<=|>=|<|>|=)(-?[\d.]+(?:e-?\d+)?)$/.exec(word))) {
        var column = cols.filter(function (c) { return c.short === m[1] || c.key === m[1]; })[0];
        if (!column) { bad.push(word); return; }
        var x = parseFloat(m[3]), op = m[2];
        tests.push(function (i) {
          var v = column.values[i];
          if (v === null) return false;
          return op === ">" ? v > x : op === "<" ? v < x : op === ">=" ? v >= x : op === "<=" ? v <= x : v === x;
        });
      } else bad.push(word);
    });
    return {bad: bad, test: function (i) {
      return (!heads.length || heads.some(function (f) { return f(i); })) && tests.every(function (f) { return f(i); });
    }};
  }

  function applyFilter() {
    var filter = compileFilter($("ck-filter").value), shown = 0;
    for (var i = 0; i < N; i++) {
      var keep = filter.test(i);
      rows[i].hidden = !keep;
      if (keep) shown++;
    }
    $("ck-count").textContent = shown + " of " + N + " heads" +
      (filter.bad.length ? " (not understood: " + filter.bad.join(" ") + ")" : "");
  }

  // ------------------------------------------------------------------------------------------ heatmaps
  function drawHeatmaps() {
    var box = $("ck-heatmaps");
    if (!box) return;
    box.textContent = "";
    var axis = 34, gap = 12, width = box.clientWidth - 2;
    var cw = Math.max(2, Math.min(26, Math.floor((width - axis - gap * cols.length) / (cols.length * H))));
    var ch = Math.max(3, Math.min(22, Math.max(cw, 4), Math.floor(560 / L)));
    var labels = el("div", {"class": "ck-mult"});
    labels.appendChild(el("div", {"class": "ck-cap"}, "layer"));
    var axisCanvas = el("canvas");
    labels.appendChild(axisCanvas);
    box.appendChild(labels);
    var ctx = sizeCanvas(axisCanvas, axis, L * ch);
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = "#555";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    var every = Math.max(1, Math.ceil(12 / ch));
    for (var l = 0; l < L; l += every) ctx.fillText(String(l), axis - 4, (l + 0.5) * ch);
    cols.forEach(function (c) {
      var fig = el("div", {"class": "ck-mult"});
      fig.appendChild(el("div", {"class": "ck-cap", title: c.description}, c.short));
      var canvas = el("canvas", {"data-col": c.key});
      fig.appendChild(canvas);
      box.appendChild(fig);
      var g = sizeCanvas(canvas, cw * H, ch * L);
      for (var i = 0; i < N; i++) {
        g.fillStyle = rgb(tone(c.values[i], c));
        g.fillRect((i % H) * cw, Math.floor(i / H) * ch, cw, ch);
      }
      if (selected >= 0) {
        g.strokeStyle = "#000";
        g.lineWidth = 2;
        g.strokeRect((selected % H) * cw + 1, Math.floor(selected / H) * ch + 1, cw - 2 < 1 ? 1 : cw - 2, ch - 2);
      }
      function at(e) {
        var r = canvas.getBoundingClientRect();
        var h = Math.floor((e.clientX - r.left) / cw), ly = Math.floor((e.clientY - r.top) / ch);
        return h >= 0 && h < H && ly >= 0 && ly < L ? ly * H + h : -1;
      }
      canvas.addEventListener("mousemove", function (e) {
        var i = at(e);
        if (i >= 0) showTip(e, "head " + headName(i) + "  " + c.short + " " + cellText(c, c.values[i])); else hideTip();
      });
      canvas.addEventListener("mouseleave", hideTip);
      canvas.addEventListener("click", function (e) { var i = at(e); if (i >= 0) select(i, "heatmap"); });
    });
  }

  // ------------------------------------------------------------------------------------------ composition
  function pairIndex(a, b) { return a * (2 * L - a - 1) / 2 + (b - a - 1); }  // layer pair a < b, in (a, b) order

  function compLut(C) {
    var c = {neutral: C.baseline === null ? 0 : C.baseline, lo: 0, hi: C.scale}, lut = [];
    for (var q = 0; q < 256; q++) lut.push(rgbArray(tone(q / 255 * C.scale, c)));
    return lut;
  }

  function aggregate(m) {
    if (aggregates[m]) return aggregates[m];
    var C = D.composition[m], bytes = blobs[C.blob], out = new Float32Array(L * L).fill(NaN), block = H * H;
    for (var a = 0; a < L; a++) for (var b = a + 1; b < L; b++) {
      var start = pairIndex(a, b) * block, best = 0;
      for (var k = 0; k < block; k++) if (bytes[start + k] > best) best = bytes[start + k];
      out[a * L + b] = best / 255 * C.scale;
    }
    return (aggregates[m] = out);
  }

  function defaultWindow() {
    if (L * H <= 160) return {s0: 0, s1: L - 1, d0: 0, d1: L - 1};
    var agg = aggregate(mode), best = 1, value = -1;
    for (var a = 0; a < L; a++) for (var b = a + 1; b < L; b++) if (agg[a * L + b] > value) { value = agg[a * L + b]; best = a * L + b; }
    return windowAround(Math.floor(best / L), best % L);
  }

  function windowAround(a, b) {
    var span = Math.max(1, Math.min(L, Math.floor(72 / H)));
    function range(centre) {
      var lo = Math.max(0, Math.min(L - span, centre - Math.floor((span - 1) / 2)));
      return [lo, lo + span - 1];
    }
    var s = range(a), d = range(b);
    return {s0: s[0], s1: s[1], d0: d[0], d1: d[1]};
  }

  function drawComposition() {
    var aggCanvas = $("ck-comp-layers"), headCanvas = $("ck-comp-heads");
    if (!aggCanvas || !mode) return;
    var C = D.composition[mode], agg = aggregate(mode);
    var c = {neutral: C.baseline === null ? 0 : C.baseline, lo: 0, hi: C.scale};
    var total = aggCanvas.closest(".ck-comp").clientWidth;
    var aggSize = Math.min(L * 36, 280, Math.max(120, Math.floor(total * 0.3)));
    var cell = aggSize / L, ctx = sizeCanvas(aggCanvas, aggSize, aggSize);
    for (var a = 0; a < L; a++) for (var b = 0; b < L; b++) {
      ctx.fillStyle = a < b ? rgb(tone(agg[a * L + b], c)) : "#f4f4f4";
      ctx.fillRect(b * cell, a * cell, Math.ceil(cell), Math.ceil(cell));
    }
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 1.5;
    ctx.strokeRect(win.d0 * cell + 0.75, win.s0 * cell + 0.75, (win.d1 - win.d0 + 1) * cell - 1.5,
                   (win.s1 - win.s0 + 1) * cell - 1.5);
    aggCanvas.onmousemove = function (e) {
      var r = aggCanvas.getBoundingClientRect(), b = Math.floor((e.clientX - r.left) / cell), a = Math.floor((e.clientY - r.top) / cell);
      if (a >= 0 && b < L && a < b) showTip(e, "layer " + a + " -> layer " + b + ": max " + mode + " " + fmt(agg[a * L + b]));
      else hideTip();
    };
    aggCanvas.onmouseleave = hideTip;
    aggCanvas.onclick = function (e) {
      var r = aggCanvas.getBoundingClientRect(), b = Math.floor((e.clientX - r.left) / cell), a = Math.floor((e.clientY - r.top) / cell);
      if (a >= 0 && b < L && a < b) { win = windowAround(a, b); drawComposition(); }
    };
    // head x head view of the window: one pixel per device pixel, sampled from the quantised blocks
    var nr = (win.s1 - win.s0 + 1) * H, nc = (win.d1 - win.d0 + 1) * H;
    var room = Math.max(160, Math.min(620, total - aggSize - 70));  // 70: the gap and both y-axis labels
    var px = Math.min(28, room / Math.max(nr, nc)), w = Math.max(1, Math.floor(nc * px)), h = Math.max(1, Math.floor(nr * px));
    var g = sizeCanvas(headCanvas, w, h), r = dpr(), W = headCanvas.width, Hh = headCanvas.height;
    var image = g.createImageData(W, Hh), pixels = image.data, lut = compLut(C), bytes = blobs[C.blob];
    for (var y = 0; y < Hh; y++) {
      var row = Math.min(nr - 1, Math.floor(y * nr / Hh)), sl = win.s0 + Math.floor(row / H), sh = row % H;
      for (var x = 0; x < W; x++) {
        var col = Math.min(nc - 1, Math.floor(x * nc / W)), dl = win.d0 + Math.floor(col / H), dh = col % H;
        var o = (y * W + x) * 4, colour;
        if (sl < dl) colour = lut[bytes[pairIndex(sl, dl) * H * H + sh * H + dh]];
        else colour = [236, 236, 236];
        pixels[o] = colour[0]; pixels[o + 1] = colour[1]; pixels[o + 2] = colour[2]; pixels[o + 3] = 255;
      }
    }
    g.setTransform(1, 0, 0, 1, 0, 0);
    g.putImageData(image, 0, 0);
    g.setTransform(r, 0, 0, r, 0, 0);
    var bw = H * px;
    if (bw >= 4) {  // layer-block grid lines
      g.strokeStyle = "rgba(0,0,0,0.45)";
      g.lineWidth = 1;
      g.beginPath();
      for (var k = 1; k <= win.d1 - win.d0; k++) { g.moveTo(k * bw, 0); g.lineTo(k * bw, h); }
      for (k = 1; k <= win.s1 - win.s0; k++) { g.moveTo(0, k * bw); g.lineTo(w, k * bw); }
      g.stroke();
    }
    function at(e) {
      var rect = headCanvas.getBoundingClientRect();
      var col = Math.floor((e.clientX - rect.left) / px), row = Math.floor((e.clientY - rect.top) / px);
      if (col < 0 || row < 0 || col >= nc || row >= nr) return null;
      var src = (win.s0 + Math.floor(row / H)) * H + row % H, dst = (win.d0 + Math.floor(col / H)) * H + col % H;
      return {src: src, dst: dst};
    }
    headCanvas.onmousemove = function (e) {
      var p = at(e);
      if (!p) { hideTip(); return; }
      var sl = Math.floor(p.src / H), dl = Math.floor(p.dst / H);
      if (sl >= dl) { showTip(e, headName(p.src) + " -> " + headName(p.dst) + ": no composition (not an earlier layer)"); return; }
      var v = blobs[C.blob][pairIndex(sl, dl) * H * H + (p.src % H) * H + (p.dst % H)] / 255 * C.scale;
      showTip(e, headName(p.src) + " -> " + headName(p.dst) + ": " + mode + " " + fmt(v) +
        (C.baseline === null ? "" : " (random " + fmt(C.baseline) + ")"));
    };
    headCanvas.onmouseleave = hideTip;
    headCanvas.onclick = function (e) { var p = at(e); if (p) select(p.dst, "composition"); };
    axis("ck-comp-layers-x", "destination layer 0 \u2192 " + (L - 1));
    axis("ck-comp-layers-y", "source layer 0 \u2192 " + (L - 1));
    axis("ck-comp-heads-x", "destination heads: layers " + win.d0 + " \u2192 " + win.d1 + " (" + H + " per block)");
    axis("ck-comp-heads-y", "source heads: layers " + win.s0 + " \u2192 " + win.s1);
    $("ck-comp-where").textContent = "showing source layers " + win.s0 + "-" + win.s1 + ", destination layers " +
      win.d0 + "-" + win.d1 + "; white = random baseline" + (C.baseline === null ? "" : " " + fmt(C.baseline));
    Array.prototype.forEach.call(document.querySelectorAll(".ck-mode"), function (b) {
      b.setAttribute("aria-pressed", b.dataset.mode === mode ? "true" : "false");
    });
  }

  function axis(id, text) { var node = $(id); if (node) node.textContent = text; }

  function showMode(m) {
    if (!D.composition[m]) return;
    mode = m;
    if (!win) win = defaultWindow();
    drawComposition();
  }

  // ------------------------------------------------------------------------------------------ head panel
  function patternOf(i) {
    var P = D.pattern.pos, bytes = blobs[D.pattern.blob], out = new Float32Array(P * P);
    if (D.pattern.triangular) {
      var per = P * (P + 1) / 2, o = i * per;
      for (var q = 0; q < P; q++) for (var k = 0; k <= q; k++) out[q * P + k] = bytes[o++] / 255;
    } else {
      for (var j = 0; j < P * P; j++) out[j] = bytes[i * P * P + j] / 255;
    }
    return out;
  }

  // the pattern of head i as rows of numbers for CircuitsVis (3 decimals: the data holds 1/255 steps)
  function patternRows(i) {
    var P = D.pattern.pos, p = patternOf(i), rows = [];
    for (var q = 0; q < P; q++) {
      var row = [];
      for (var k = 0; k < P; k++) row.push(Math.round(p[q * P + k] * 1000) / 1000);
      rows.push(row);
    }
    return rows;
  }

  // CircuitsVis charts stay registered (Chart.js) after their node leaves the page: free their pixels at least
  function releaseCharts(node) {
    if (!node) return;
    Array.prototype.forEach.call(node.querySelectorAll("canvas"), function (c) { c.width = 0; c.height = 0; });
  }

  function drawPattern(box, i) {
    box.appendChild(el("div", {"class": "ck-cap"}, "attention on " + (D.pattern.on || "the repeated sequence") + " (rows: query)"));
    if (!CV) { drawCanvasPattern(box, i, Math.min(340, box.clientWidth - 10), "ck-pattern"); return; }
    var view = el("div", {id: "ck-cv-pattern", "class": "ck-cv", "data-head": headName(i)});
    box.appendChild(view);
    CV.render("ck-cv-pattern", CV.AttentionPattern, {
      tokens: cvTokens, attention: patternRows(i), maxValue: 1, minValue: 0, maskUpperTri: D.pattern.triangular
    });
  }

  // the plain-canvas drawing of head i's pattern: the fallback when CircuitsVis did not load
  function drawCanvasPattern(box, i, size, id) {
    var P = D.pattern.pos, p = patternOf(i), cell = size / P;
    var canvas = el("canvas", {id: id, "class": "ck-pattern", "data-head": headName(i)});
    box.appendChild(canvas);
    var g = sizeCanvas(canvas, size, size);
    g.fillStyle = "#fff";
    g.fillRect(0, 0, size, size);
    for (var q = 0; q < P; q++) for (var k = 0; k < P; k++) {
      var v = p[q * P + k];
      if (v <= 0) continue;
      g.fillStyle = "rgb(" + Math.round(255 - 247 * v) + "," + Math.round(255 - 207 * v) + "," + Math.round(255 - 148 * v) + ")";
      g.fillRect(k * cell, q * cell, Math.ceil(cell), Math.ceil(cell));
    }
    g.strokeStyle = "rgba(214,96,77,0.7)";
    g.lineWidth = 1;
    g.beginPath();
    (D.copies || []).slice(1).forEach(function (start) {
      g.moveTo(start * cell, 0); g.lineTo(start * cell, size); g.moveTo(0, start * cell); g.lineTo(size, start * cell);
    });
    g.stroke();
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect(), k = Math.floor((e.clientX - r.left) / cell), q = Math.floor((e.clientY - r.top) / cell);
      if (q < 0 || k < 0 || q >= P || k >= P) { hideTip(); return; }
      showTip(e, "query " + q + " " + JSON.stringify(D.tokens[q]) + " -> key " + k + " " + JSON.stringify(D.tokens[k]) +
        ": " + fmt(p[q * P + k]));
    });
    canvas.addEventListener("mouseleave", hideTip);
  }

  // the circuit's heads side by side: CircuitsVis AttentionHeads (hover a thumbnail to enlarge it)
  function drawCircuitView() {
    var box = $("ck-cv-circuit"), heads = D.circuit_view || [];
    if (!box || !D.pattern || !heads.length) return;
    box.textContent = "";
    if (!CV) {
      heads.forEach(function (h) {
        var fig = el("div", {"class": "ck-mult"});
        fig.appendChild(el("div", {"class": "ck-cap"}, headName(h.head) + " " + h.role));
        box.appendChild(fig);
        drawCanvasPattern(fig, h.head, 150, "ck-circuit-" + headName(h.head).replace(".", "-"));
      });
      box.classList.add("ck-multiples");
      return;
    }
    CV.render("ck-cv-circuit", CV.AttentionHeads, {
      tokens: cvTokens,
      attention: heads.map(function (h) { return patternRows(h.head); }),
      attentionHeadNames: heads.map(function (h) { return inertText(headName(h.head) + " " + h.role); }),
      maxValue: 1, minValue: 0, maskUpperTri: D.pattern.triangular
    });
  }

  // resolves once every node has CircuitsVis canvases (Chart.js draws them on mount), or after CV_WAIT_MS
  function chartsDrawn(ids) {
    var t0 = performance.now();
    return new Promise(function (resolve) {
      (function check() {
        var done = ids.every(function (id) { var n = $(id); return !n || n.querySelector("canvas"); });
        if (done || performance.now() - t0 > CV_WAIT_MS) requestAnimationFrame(function () { resolve(done); });
        else requestAnimationFrame(check);
      })();
    });
  }

  // runs the CircuitsVis bundle once; null when it worked, else the reason
  async function loadCircuitsVis(node) {
    if (!node) return "its bundle is missing from the page";
    try {
      var code = new TextDecoder().decode(await unpack(node)), script = document.createElement("script");
      script.textContent = code;
      document.head.appendChild(script);
      if (typeof window.CircuitsVis === "undefined" || typeof window.CircuitsVis.render !== "function" ||
          !window.CircuitsVis.AttentionPattern || !window.CircuitsVis.AttentionHeads) {
        return "its bundle did not define CircuitsVis.render, AttentionPattern and AttentionHeads";
      }
      CV = window.CircuitsVis;
      return null;
    } catch (error) {
      return String(error);
    }
  }

  function drawSpectra(box, i) {
    var names = Object.keys(D.spectra);
    if (!names.length) return;
    box.appendChild(el("div", {"class": "ck-cap"}, "singular values (bars relative to the largest, sigma_1 printed)"));
    var row = el("div", {"class": "ck-spectra"});
    box.appendChild(row);
    names.forEach(function (name) {
      var S = D.spectra[name], bytes = blobs[S.blob], k = S.k, fig = el("div");
      fig.appendChild(el("div", {"class": "ck-cap"}, name + "  sigma_1 = " + fmt(S.max[i])));
      var canvas = el("canvas", {"data-circuit": name});
      fig.appendChild(canvas);
      row.appendChild(fig);
      var w = Math.floor((box.clientWidth - 24) / names.length), h = 60, g = sizeCanvas(canvas, w, h), bar = w / k;
      g.fillStyle = "#fafafa";
      g.fillRect(0, 0, w, h);
      g.fillStyle = name === "OV" ? "#d9822b" : "#3b6fb6";
      for (var j = 0; j < k; j++) {
        var v = bytes[i * k + j] / 255;
        g.fillRect(j * bar, h - v * (h - 2), Math.max(1, bar - (bar > 3 ? 1 : 0)), v * (h - 2));
      }
    });
  }

  function headLink(i, label) {
    return el("span", {"class": "ck-head", "data-head": headName(i), tabindex: "0"}, label || headName(i));
  }

  function drawEdges(box, i) {
    var modes = Object.keys(D.composition);
    if (!modes.length) return;
    var table = el("table", {"class": "ck-small ck-edges"}), head = el("tr");
    ["", "strongest in (from)", "strongest out (to)"].forEach(function (t) { head.appendChild(el("th", null, t)); });
    table.appendChild(head);
    modes.forEach(function (m) {
      var C = D.composition[m], tr = el("tr");
      tr.appendChild(el("th", null, m));
      [C["in"][i], C.out[i]].forEach(function (list) {
        var td = el("td");
        if (!list.length) td.appendChild(el("span", {"class": "note"}, "none"));
        list.forEach(function (pair, n) {
          if (n) td.appendChild(document.createTextNode(", "));
          td.appendChild(headLink(pair[0]));
          td.appendChild(document.createTextNode(" " + fmt(pair[1], 2)));
        });
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    box.appendChild(el("div", {"class": "ck-cap"}, "composition edges (random baseline: " + modes.map(function (m) {
      return m + " " + fmt(D.composition[m].baseline, 2);
    }).join(", ") + ")"));
    box.appendChild(table);
  }

  function showDetail(i) {
    var box = $("ck-detail");
    if (!box) return;
    releaseCharts(box);
    box.textContent = "";
    box.dataset.head = headName(i);
    var roles = D.role_heads.filter(function (r) { return r.heads.indexOf(i) >= 0; })
                            .map(function (r) { return r.role; });
    box.appendChild(el("h3", null, "head " + headName(i) + (roles.length ? " (" + roles.join(", ") + ")" : "")));
    var chips = el("div", {"class": "ck-chips"});
    cols.forEach(function (c) {
      var v = c.values[i], t = tone(v, c), range = interval(c, i);
      var chip = el("span", {"class": "ck-chip", title: c.description + (range ? "; " + range.title : "")},
                    c.short + " " + cellText(c, v) + (range ? " [" + fmt(c.ci_lo[i]) + ", " + fmt(c.ci_hi[i]) + "]" : ""));
      if (t !== null) { chip.style.background = rgb(t); if (Math.abs(t) > 0.55) chip.style.color = "#fff"; }
      if (c.topSet[i]) chip.style.fontWeight = "700";
      chips.appendChild(chip);
    });
    box.appendChild(chips);
    if (D.pattern) drawPattern(box, i);
    drawSpectra(box, i);
    drawEdges(box, i);
  }

  // ------------------------------------------------------------------------------------------ selection
  function select(i, from) {
    if (i < 0 || i >= N) return;
    selected = i;
    var name = headName(i);
    Array.prototype.forEach.call(document.querySelectorAll(".ck-sel"), function (n) { n.classList.remove("ck-sel"); });
    Array.prototype.forEach.call(document.querySelectorAll('[data-head="' + name + '"]'), function (n) {
      if (!inPattern(n)) n.classList.add("ck-sel");
    });
    if (rows.length && from !== "table" && !rows[i].hidden) {
      var wrap = rows[i].closest(".ck-table-wrap");
      wrap.scrollTop = rows[i].offsetTop - wrap.clientHeight / 2;
    }
    drawHeatmaps();
    showDetail(i);
    // narrow pages stack the head panel under everything: bring it into view, or a click would seem to do nothing
    var box = $("ck-detail");
    if (box && ["table", "heatmap", "composition", "link"].indexOf(from) >= 0) {
      var rect = box.getBoundingClientRect();
      if (rect.top > window.innerHeight || rect.bottom < 0) box.scrollIntoView({block: "start"});
    }
  }

  // the pattern views carry data-head (which head they show) but a click inside them selects nothing
  function inPattern(node) { return !!(node.closest && node.closest(".ck-pattern, .ck-cv")); }

  function main() {
    D = JSON.parse($("ck-data").textContent);
    L = D.n_layers; H = D.n_heads; N = L * H;
    cols = D.columns;
    cvTokens = D.tokens.map(function (t) {
      return inertText(t.length > CV_TOKEN_CHARS ? t.slice(0, CV_TOKEN_CHARS - 1) + "\u2026" : t);
    });
    cols.forEach(function (c) { c.topSet = {}; c.top.forEach(function (i) { c.topSet[i] = true; }); });
    tip = el("div", {id: "ck-tip", "class": "ck-tip"});
    document.body.appendChild(tip);
    document.addEventListener("click", function (e) {
      var target = e.target.closest ? e.target.closest("[data-head]") : null;
      if (target && !inPattern(target)) select(parseHead(target.dataset.head), target.tagName === "TR" ? "table" : "link");
    });
    document.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && e.target.dataset && e.target.dataset.head) select(parseHead(e.target.dataset.head), "link");
    });
    buildTable();
    Array.prototype.forEach.call(document.querySelectorAll(".ck-mode"), function (b) {
      b.addEventListener("click", function () { showMode(b.dataset.mode); });
    });
    var all = $("ck-comp-all");
    if (all) all.addEventListener("click", function () { win = {s0: 0, s1: L - 1, d0: 0, d1: L - 1}; drawComposition(); });
    var modes = Object.keys(D.composition);
    if (modes.length) showMode(modes.indexOf("K") >= 0 ? "K" : modes[0]);
    var byInduction = cols.filter(function (c) { return c.key === "induction"; })[0];
    if (cols.length) sortBy(D.sort || (byInduction ? "induction" : cols[0].key));
    var called = D.role_heads.filter(function (r) { return r.heads.length; })[0];  // the first role that calls a head
    var first = called ? called.heads[0] : (cols.length && cols[0].top.length ? cols[0].top[0] : 0);
    select(first, "start");
    drawCircuitView();
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () { drawHeatmaps(); drawComposition(); if (selected >= 0) showDetail(selected); }, 150);
    });
  }

  async function start() {
    var status = $("ck-status");
    status.textContent = "Drawing the figures\u2026";
    try {
      var nodes = document.querySelectorAll('script[id^="ck-blob-"]'), library = loadCircuitsVis($("ck-lib-circuitsvis"));
      var unpacked = await Promise.all(Array.prototype.map.call(nodes, unpack));
      for (var i = 0; i < nodes.length; i++) blobs[nodes[i].id.slice(8)] = unpacked[i];
      cvError = await library;
      main();
      if (CV && !(await chartsDrawn(["ck-cv-pattern", "ck-cv-circuit"]))) {
        cvError = "its charts did not appear";
        CV = null;  // draw both views again on the plain canvas
        if (selected >= 0) showDetail(selected);
        drawCircuitView();
      }
      document.documentElement.dataset.ckCircuitsvis = cvError ? "failed" : "drawn";
      if (cvError) {
        status.hidden = false;
        status.textContent = "CircuitsVis did not load (" + cvError + "): attention patterns are drawn on a plain " +
          "canvas instead.";
        status.className = "note warn";
        console.warn("circuitkit report: CircuitsVis did not load: " + cvError);
      } else {
        status.textContent = "";
        status.hidden = true;
      }
      document.documentElement.dataset.ckDrawMs = String(Math.round(performance.now()));
      document.documentElement.dataset.ckReady = "true";
    } catch (error) {
      status.hidden = false;
      status.textContent = "Could not draw the figures: " + error;
      status.className = "note failed";
      document.documentElement.dataset.ckReady = "error";
      console.error(error);
    }
  }

  window.circuitkitReport = {
    select: function (name) { select(parseHead(name), "api"); },
    showMode: showMode,
    sortBy: sortBy,
    inertText: inertText,
    cvTokens: function () { return cvTokens.slice(); },
    wholeModel: function () { win = {s0: 0, s1: L - 1, d0: 0, d1: L - 1}; drawComposition(); }
  };
  start();
})();
