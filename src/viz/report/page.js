// gpumem report: for each timeline, the chart's hover and click, a zoomed view drawn from the
// envelope (per-pixel lowest and highest values) and, where the recorder kept them, the exact
// events, and the segment map after any kept event, rebuilt from the layout at the start of its
// stretch plus the events. Strings from the data are only ever written as text.
"use strict";
(function () {
  document.body.dataset.scriptStartMs = String(Math.round(performance.now()));
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const KINDS = DATA.kinds;
  const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  const POOLS = ["small", "large"];
  const NS = "http://www.w3.org/2000/svg";
  const MARK_NAMES = ["OOM", "empty_cache()", "▸"];
  const MARK_CLASSES = ["oom", "empty_cache", "phase"];

  function bytes(n) {
    for (const [name, size] of UNITS) {
      if (n >= size) return trim(n / size) + " " + name;
    }
    return n + " B";
  }
  function trim(value) {
    return value.toFixed(2).replace(/0+$/, "").replace(/\.$/, "");
  }
  function hex(n) {
    return "0x" + n.toString(16);
  }
  function el(tag, attributes, text) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function line(text, className) {
    const node = document.createElement("div");
    if (className) node.className = className;
    node.textContent = text;
    return node;
  }
  function shortNumber(x) {
    if (x >= 1e6) return trim(x / 1e6) + "M";
    if (x >= 1e5) return trim(x / 1e3) + "k";
    return String(x);
  }

  // Follows allocated and reserved bytes from what each event moves, as the recorder does.
  function follow(kind, size, figures) {
    switch (kind) {
      case "alloc": figures[0] += size; break;
      case "free_requested": figures[0] = Math.max(0, figures[0] - size); break;
      case "segment_alloc": case "segment_map": figures[1] += size; break;
      case "segment_free": case "segment_unmap": figures[1] = Math.max(0, figures[1] - size); break;
    }
  }

  function Panel(root, data) {
    const trace = data.numbering === "trace";
    const FROM = data.from, TO = data.to;
    const env = data.envelope;
    const labels = data.labels;
    const RANGES = data.expandable || []; // [base, reserved, page, pool]

    function numberText(position) {
      return trace ? "event " + position : "#" + position;
    }
    function site(context) {
      if (trace || !(context > 0 && context <= labels.length)) return "";
      const [label, helper] = labels[context - 1];
      return helper ? label + " (" + helper + ")" : label;
    }

    // ---- the kept stretches, expanded ----
    const windows = data.windows.map((w) => {
      const n = w.events.length;
      const pos = new Float64Array(n), alloc = new Float64Array(n), res = new Float64Array(n);
      const figures = [w.before[0], w.before[1]];
      let p = w.start;
      w.events.forEach((e, i) => {
        p += e[4];
        pos[i] = p;
        follow(KINDS[e[0]], e[2], figures);
        alloc[i] = figures[0];
        res[i] = figures[1];
      });
      if (figures[0] !== w.after[0] || figures[1] !== w.after[1]) {
        console.error("gpumem report: a stretch's figures do not add up", w.first);
      }
      return { raw: w, events: w.events, pos, alloc, res, n, firstPos: n ? pos[0] : w.start, lastPos: n ? pos[n - 1] : w.start };
    });
    // Stretches are in order and do not overlap: the last one starting at or before a
    // number is the only one that can hold it.
    function lastStartingBy(position, strictly) {
      let lo = 0, hi = windows.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        const start = windows[mid].firstPos;
        if (strictly ? start < position : start <= position) lo = mid + 1; else hi = mid;
      }
      return lo - 1;
    }
    function windowAt(position) {
      const index = lastStartingBy(position, false);
      if (index < 0) return -1;
      const w = windows[index];
      return w.n && position <= w.lastPos ? index : -1;
    }
    // First index in w with pos >= position.
    function lowerBound(w, position) {
      let lo = 0, hi = w.n;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (w.pos[mid] < position) lo = mid + 1; else hi = mid;
      }
      return lo;
    }
    function stateBefore(w, index) {
      return index > 0 ? [w.alloc[index - 1], w.res[index - 1]] : w.raw.before;
    }

    // ---- values over a range of event numbers: exact in a stretch, else the envelope ----
    function envelopeOver(from, to) {
      if (to <= from || to <= env.origin) return null;
      const count = env.allocated_max.length;
      const first = Math.max(0, Math.floor((from - env.origin) / env.width));
      const last = Math.min(count - 1, Math.floor((to - 1 - env.origin) / env.width));
      if (first > last) return null;
      const r = [Infinity, -Infinity, Infinity, -Infinity];
      for (let b = first; b <= last; b++) {
        r[0] = Math.min(r[0], env.allocated_min[b]);
        r[1] = Math.max(r[1], env.allocated_max[b]);
        r[2] = Math.min(r[2], env.reserved_min[b]);
        r[3] = Math.max(r[3], env.reserved_max[b]);
      }
      return r;
    }
    function exactOver(w, from, to) {
      const start = lowerBound(w, from);
      const r = [Infinity, -Infinity, Infinity, -Infinity];
      const take = (a, b) => {
        r[0] = Math.min(r[0], a); r[1] = Math.max(r[1], a);
        r[2] = Math.min(r[2], b); r[3] = Math.max(r[3], b);
      };
      if (start >= w.n || w.pos[start] > from) {
        const [a, b] = stateBefore(w, start);
        take(a, b);
      }
      for (let i = start; i < w.n && w.pos[i] < to; i++) take(w.alloc[i], w.res[i]);
      return r;
    }
    // The stretch whose events cover [from, to) entirely (the state carried into `from`
    // included), if any.
    function covering(from, to) {
      const index = lastStartingBy(from, true);
      if (index < 0) return null;
      const w = windows[index];
      return w.n && to - 1 <= w.lastPos ? w : null;
    }
    function over(from, to) {
      const w = covering(from, to);
      return w ? exactOver(w, from, to) : envelopeOver(from, to);
    }
    function exactness(from, to) {
      if (covering(from, to) || env.width === 1) return "every event";
      return "per " + env.width + " events (envelope)";
    }

    // ---- marks ----
    const marks = data.marks; // [position, kind, context, extra]
    const ooms = marks.filter((m) => m[1] === 0);
    function markText(mark) {
      const [, kind, context, extra] = mark;
      if (kind === 2) return "mark: " + extra;
      const where = site(context);
      let text = MARK_NAMES[kind] + (where ? " " + where : "");
      if (kind === 0 && extra) {
        const [reserved, segment, free, cap] = extra;
        text += ": " + bytes(reserved) + " reserved + a " + bytes(segment) + " segment";
        if (cap !== null && reserved + segment > cap && segment <= free) text += " > the fraction cap " + bytes(cap);
        else text += ", " + bytes(free) + " free on the device";
      }
      return text;
    }

    // The texts a marker's label may take, longest first: the whole, then (a phase) its name
    // cut shorter, then its kind alone; as the PNG chart labels its markers (src/viz/chart.rs).
    function labelTexts(mark) {
      const [, kind, context, extra] = mark;
      if (kind !== 2) {
        const where = site(context);
        return where ? [MARK_NAMES[kind] + " " + where, MARK_NAMES[kind]] : [MARK_NAMES[kind]];
      }
      const name = Array.from(String(extra));
      const texts = ["▸ " + name.join("")];
      for (const keep of [24, 16, 10, 6, 3]) {
        if (name.length > keep) texts.push("▸ " + name.slice(0, keep).join("").trimEnd() + "…");
      }
      texts.push("▸");
      return texts;
    }
    const measure = document.createElement("canvas").getContext("2d");
    measure.font = '12px "DejaVu Sans", sans-serif';
    // Labels for markers at pixel columns `xs` (in order) between `left` and `right`: each
    // right of its line, else left of it, never across a neighbour's line, in the first of
    // three rows where it overlaps no other label. Returns [row, x, text, kind] per label.
    function placeMarkerLabels(shown, xs, left, right) {
      const PAD = 4;
      const rows = [[], [], []];
      const placed = [];
      shown.forEach((mark, i) => {
        const x = xs[i];
        const lowest = i > 0 ? xs[i - 1] : left;
        const highest = i + 1 < xs.length ? xs[i + 1] : right;
        for (const text of labelTexts(mark)) {
          const w = measure.measureText(text).width;
          const starts = [];
          if (x + PAD + w + PAD <= highest) starts.push(x + PAD);
          if (x - PAD - w - PAD >= lowest) starts.push(x - PAD - w);
          for (const start of starts) {
            const row = rows.findIndex((spans) => spans.every(([a, b]) => start + w + PAD <= a || start >= b + PAD));
            if (row >= 0) {
              rows[row].push([start, start + w]);
              placed.push([row, start, text, mark[1]]);
              return;
            }
          }
        }
      });
      return placed;
    }

    // ---- the overview chart's hover and click ----
    const g = data.geometry;
    const wrap = root.querySelector(".chart-wrap");
    const chart = wrap.querySelector("svg");
    const cursor = wrap.querySelector(".cursor");
    const tip = wrap.querySelector(".tip");
    function overviewPosition(clientX) {
      const rect = chart.getBoundingClientRect();
      const scale = g.width / rect.width;
      const x = (clientX - rect.left) * scale;
      const f = Math.max(0, Math.min(1, (x - g.left) / (g.right - g.left)));
      const per = (g.to - g.from) / (g.right - g.left);
      const position = Math.floor(g.from + f * (g.to - g.from));
      return { position, span: Math.max(1, Math.round(per)), rect, scale };
    }
    // The lines a tooltip shows for the event numbers [from, to).
    function describeRange(from, to) {
      const lines = [];
      const index = windowAt(from);
      if (to - from <= 1 && index >= 0) {
        const w = windows[index];
        const first = lowerBound(w, from);
        let i = first;
        for (; i < w.n && w.pos[i] === from && i - first < 4; i++) lines.push(describeEvent(w, i));
        let more = 0;
        while (i < w.n && w.pos[i] === from) { more++; i++; }
        if (more) lines.push(["… and " + more + " more events at " + numberText(from), ""]);
        if (!lines.length) {
          const [a, b] = stateBefore(w, first);
          lines.push([numberText(from) + ": no allocator event", ""]);
          lines.push(["allocated " + bytes(a) + " · reserved " + bytes(b), ""]);
        }
        return lines;
      }
      const r = over(from, to);
      const title = to - from <= 1 ? numberText(from) : numberText(from) + " – " + numberText(to - 1).replace(/^event |^#/, "");
      lines.push([title, "b"]);
      if (r) {
        lines.push(["allocated " + (r[0] === r[1] ? bytes(r[1]) : bytes(r[0]) + " – " + bytes(r[1])), ""]);
        lines.push(["reserved " + (r[2] === r[3] ? bytes(r[3]) : bytes(r[2]) + " – " + bytes(r[3])), ""]);
      }
      for (const mark of marks) {
        if (mark[0] >= from && mark[0] < to) { lines.push([markText(mark), "m"]); if (lines.length > 8) break; }
      }
      return lines;
    }
    function describeEvent(w, i) {
      const [code, address, size, pool, , context] = w.events[i];
      const kind = KINDS[code];
      let text;
      switch (kind) {
        case "oom": text = "out of memory: a " + bytes(size) + " segment could not be had"; break;
        case "empty_cache": text = "empty_cache() called"; break;
        default: text = kind + " " + bytes(size) + " at " + hex(address) + " (" + POOLS[pool] + " pool)";
      }
      const where = site(context);
      return [numberText(w.pos[i]) + ": " + text + (where ? " — " + where : "") +
        " — allocated " + bytes(w.alloc[i]) + ", reserved " + bytes(w.res[i]), kind === "oom" ? "m" : ""];
    }
    function showTip(tipNode, lines) {
      tipNode.replaceChildren(...lines.map(([text, cls]) => line(text, cls)));
      tipNode.style.display = "block";
    }
    // Right of the cursor at `x`, else left of it, never past either edge of the chart.
    function placeTip(tipNode, x, left, width) {
      const w = tipNode.offsetWidth;
      let at = x + 12 + w <= left + width ? x + 12 : x - 12 - w;
      at = Math.max(left, Math.min(at, left + width - w));
      tipNode.style.left = at + "px";
    }
    if (chart) {
      chart.addEventListener("mousemove", (event) => {
        const { position, span, rect, scale } = overviewPosition(event.clientX);
        const origin = wrap.getBoundingClientRect();
        const chartLeft = rect.left - origin.left;
        const x = chartLeft + (g.left + ((position - g.from) / (g.to - g.from)) * (g.right - g.left)) / scale;
        const top = rect.top - origin.top + g.top / scale;
        cursor.style.display = "block";
        cursor.style.left = x + "px";
        cursor.style.top = top + "px";
        cursor.style.height = (g.bottom - g.top) / scale + "px";
        showTip(tip, describeRange(position, position + span));
        placeTip(tip, x, chartLeft, rect.width);
        tip.style.top = top + 8 + "px";
      });
      chart.addEventListener("mouseleave", () => {
        cursor.style.display = "none";
        tip.style.display = "none";
      });
      chart.addEventListener("click", (event) => {
        const { position } = overviewPosition(event.clientX);
        const span = Math.max(80, Math.round((TO - FROM) / 40));
        focus(position, span);
      });
    }

    // ---- the zoomed view ----
    const zoomSvg = root.querySelector("svg.zoom");
    const zoomWrap = root.querySelector(".zoom-wrap");
    const zoomCursor = zoomWrap.querySelector(".cursor");
    const zoomTip = zoomWrap.querySelector(".tip");
    const zoomRange = root.querySelector(".zoom-range");
    const ZW = 1060, ZH = 330, ZL = 74, ZR = 16, ZT = 50, ZB = 40;
    const zoom = { from: FROM, to: TO };
    const drawn = { allocated: 0, reserved: 0 };
    function niceStep(span, count) {
      const raw = span / count;
      const power = 10 ** Math.floor(Math.log10(raw));
      for (const f of [1, 2, 5, 10]) if (f * power >= raw) return f * power;
      return 10 * power;
    }
    function drawZoom() {
      const from = zoom.from, to = zoom.to, span = to - from;
      const width = ZW - ZL - ZR, height = ZH - ZT - ZB;
      const columns = [];
      let top = 0;
      for (let c = 0; c < width; c++) {
        const a = from + Math.floor((c * span) / width);
        const b = Math.max(a + 1, from + Math.floor(((c + 1) * span) / width));
        const r = over(a, b);
        columns.push(r);
        if (r) top = Math.max(top, r[3]);
      }
      const capTop = Math.max(0, ...data.caps.map((c) => c[1] || 0));
      top = Math.max(top, capTop, 1);
      const yMax = top * 1.12;
      const X = (p) => ZL + ((p - from) / span) * width;
      const Y = (v) => ZT + height - (v / yMax) * height;
      const parts = [];
      parts.push(el("rect", { x: ZL, y: ZT, width, height, class: "plot" }));
      // y ticks
      const [unitName, unit] = UNITS.find(([, size]) => top >= size) || ["B", 1];
      const yStep = niceStep(yMax / unit, 5) * unit;
      for (let v = 0; v <= yMax; v += yStep) {
        parts.push(el("line", { x1: ZL, x2: ZL + width, y1: Y(v), y2: Y(v), class: "grid" }));
        parts.push(el("text", { x: ZL - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, trim(v / unit)));
      }
      parts.push(el("text", { x: 14, y: ZT + height / 2, class: "tick", transform: "rotate(-90 14 " + (ZT + height / 2) + ")", "text-anchor": "middle" }, unitName));
      // x ticks
      const xStep = Math.max(1, niceStep(span, 8));
      for (let p = Math.ceil(from / xStep) * xStep; p < to; p += xStep) {
        parts.push(el("line", { x1: X(p), x2: X(p), y1: ZT, y2: ZT + height, class: "grid" }));
        parts.push(el("text", { x: X(p), y: ZT + height + 16, class: "tick", "text-anchor": "middle" }, shortNumber(p)));
      }
      parts.push(el("text", { x: ZL + width / 2, y: ZH - 6, class: "tick", "text-anchor": "middle" },
        trace ? "event of the snapshot file (index)" : "allocator event (#)"));
      // the two figures: band between lowest and highest per column, line along the highest
      drawn.allocated = 0; drawn.reserved = 0;
      for (const [lo, hi, cls] of [[2, 3, "reserved"], [0, 1, "allocated"]]) {
        let band = "", topLine = "";
        const bottoms = [];
        columns.forEach((r, c) => {
          if (!r) return;
          const x0 = ZL + c, x1 = ZL + c + 1;
          topLine += (topLine ? "L" : "M") + x0 + "," + Y(r[hi]).toFixed(1) + "L" + x1 + "," + Y(r[hi]).toFixed(1);
          bottoms.push([x0, x1, Y(r[lo])]);
          if (cls === "allocated") drawn.allocated = Math.max(drawn.allocated, r[hi]);
          else drawn.reserved = Math.max(drawn.reserved, r[hi]);
        });
        if (!topLine) continue;
        band = topLine;
        for (let i = bottoms.length - 1; i >= 0; i--) band += "L" + bottoms[i][1] + "," + bottoms[i][2].toFixed(1) + "L" + bottoms[i][0] + "," + bottoms[i][2].toFixed(1);
        parts.push(el("path", { d: band + "Z", class: "band " + cls }));
        let under = "M" + bottoms[0][0] + "," + Y(0);
        for (const [x0, x1, y] of bottoms) under += "L" + x0 + "," + y.toFixed(1) + "L" + x1 + "," + y.toFixed(1);
        under += "L" + bottoms[bottoms.length - 1][1] + "," + Y(0) + "Z";
        parts.push(el("path", { d: under, class: "under " + cls }));
        parts.push(el("path", { d: topLine, class: "line " + cls }));
      }
      // the fraction cap, where set
      const caps = data.caps.concat([[TO, null]]);
      for (let i = 0; i + 1 < caps.length; i++) {
        const [at, cap] = caps[i];
        const end = caps[i + 1][0];
        if (cap === null || end <= from || at >= to) continue;
        parts.push(el("line", { x1: X(Math.max(at, from)), x2: X(Math.min(end, to)), y1: Y(cap), y2: Y(cap), class: "cap" }));
      }
      // markers: a line each; a label where it fits between its neighbours' lines
      const shown = marks.filter((m) => m[0] >= from && m[0] < to);
      // An event's marker stands in the middle of its step; a phase begins where its step does.
      const xs = shown.map((m) => X(m[1] === 2 ? m[0] : m[0] + 0.5));
      shown.forEach((mark, i) => {
        parts.push(el("line", { x1: xs[i], x2: xs[i], y1: 4, y2: ZT + height, class: "marker " + MARK_CLASSES[mark[1]] }));
      });
      for (const [row, x, text, kind] of placeMarkerLabels(shown, xs, ZL, ZL + width)) {
        // In the band above the plot: a label never covers data.
        parts.push(el("text", { x, y: 14 + 14 * row, class: "marker-label " + MARK_CLASSES[kind] }, text));
      }
      // the selected event
      if (selection.position >= from && selection.position < to) {
        parts.push(el("line", { x1: X(selection.position + 0.5), x2: X(selection.position + 0.5), y1: ZT, y2: ZT + height, class: "selected" }));
      }
      zoomSvg.setAttribute("viewBox", "0 0 " + ZW + " " + ZH);
      zoomSvg.setAttribute("width", String(ZW));
      zoomSvg.setAttribute("height", String(ZH));
      zoomSvg.replaceChildren(...parts);
      zoomRange.textContent = numberText(from) + " to " + numberText(to - 1).replace(/^event |^#/, "") +
        " (" + span + " event numbers; " + exactness(from, to) + ")";
      root.dataset.zoomFrom = String(from);
      root.dataset.zoomTo = String(to);
      root.dataset.drawnAllocatedPeak = String(drawn.allocated);
      root.dataset.drawnReservedPeak = String(drawn.reserved);
    }
    function zoomPosition(clientX) {
      const rect = zoomSvg.getBoundingClientRect();
      const x = ((clientX - rect.left) / rect.width) * ZW;
      const f = Math.max(0, Math.min(1, (x - ZL) / (ZW - ZL - ZR)));
      const span = zoom.to - zoom.from;
      return { position: Math.floor(zoom.from + f * span), per: Math.max(1, Math.round(span / (ZW - ZL - ZR))), rect };
    }
    zoomSvg.addEventListener("mousemove", (event) => {
      const { position, per, rect } = zoomPosition(event.clientX);
      const origin = zoomWrap.getBoundingClientRect();
      const scale = ZW / rect.width;
      const x = rect.left - origin.left + (ZL + ((position + 0.5 - zoom.from) / (zoom.to - zoom.from)) * (ZW - ZL - ZR)) / scale;
      zoomCursor.style.display = "block";
      zoomCursor.style.left = x + "px";
      zoomCursor.style.top = rect.top - origin.top + ZT / scale + "px";
      zoomCursor.style.height = (ZH - ZT - ZB) / scale + "px";
      showTip(zoomTip, describeRange(position, position + per));
      placeTip(zoomTip, x, rect.left - origin.left, rect.width);
      zoomTip.style.top = rect.top - origin.top + ZT / scale + 8 + "px";
    });
    zoomSvg.addEventListener("mouseleave", () => {
      zoomCursor.style.display = "none";
      zoomTip.style.display = "none";
    });
    zoomSvg.addEventListener("click", (event) => {
      const { position } = zoomPosition(event.clientX);
      select(position);
      drawZoom();
    });

    // Shows `span` event numbers around `position`, and the event there in the map.
    function focus(position, span, eventIndex) {
      span = Math.max(8, Math.min(TO - FROM, Math.round(span)));
      let from = Math.round(position - span / 2);
      from = Math.max(FROM, Math.min(TO - span, from));
      zoom.from = from;
      zoom.to = from + span;
      select(position, eventIndex);
      drawZoom();
    }
    const SINGLE = 48; // event numbers across the zoom at single-event resolution
    function jump(position, matches) {
      const index = windowAt(position);
      let eventIndex;
      if (index >= 0 && matches) {
        const w = windows[index];
        for (let i = lowerBound(w, position); i < w.n && w.pos[i] === position; i++) {
          if (matches(w, i)) { eventIndex = i; break; }
        }
      }
      focus(position, index >= 0 ? SINGLE : Math.max(SINGLE, env.width * 64), eventIndex);
    }
    function jumpOom(direction) {
      if (!ooms.length) return;
      const here = selection.position;
      const target = direction > 0 ? ooms.find((m) => m[0] > here) || ooms[0] : ooms.filter((m) => m[0] < here).pop() || ooms[ooms.length - 1];
      jump(target[0], (w, i) => KINDS[w.events[i][0]] === "oom");
    }
    function jumpMark(direction) {
      if (!marks.length) return;
      const here = selection.position;
      const target = direction > 0 ? marks.find((m) => m[0] > here) || marks[0] : marks.filter((m) => m[0] < here).pop() || marks[marks.length - 1];
      jump(target[0], (w, i) => target[1] !== 2 && KINDS[w.events[i][0]] === (target[1] === 0 ? "oom" : "empty_cache"));
    }
    const actions = {
      "prev-oom": () => jumpOom(-1),
      "next-oom": () => jumpOom(1),
      "prev-mark": () => jumpMark(-1),
      "next-mark": () => jumpMark(1),
      "peak-allocated": () => jump(data.peaks.allocated[1], (w, i) => w.alloc[i] === data.peaks.allocated[0]),
      "peak-reserved": () => jump(data.peaks.reserved[1], (w, i) => w.res[i] === data.peaks.reserved[0]),
      "zoom-in": () => focus(selection.position, (zoom.to - zoom.from) / 4, selection.eventIndex),
      "zoom-out": () => focus(selection.position, (zoom.to - zoom.from) * 4, selection.eventIndex),
      all: () => { zoom.from = FROM; zoom.to = TO; drawZoom(); },
      prev: () => step(-1),
      next: () => step(1),
    };
    root.querySelectorAll("button[data-act]").forEach((button) => {
      const act = actions[button.dataset.act];
      if (act) button.addEventListener("click", act);
    });
    if (!ooms.length) root.querySelectorAll("button[data-act$='-oom']").forEach((b) => { b.disabled = true; });
    if (!marks.length) root.querySelectorAll("button[data-act$='-mark']").forEach((b) => { b.disabled = true; });

    // ---- the segment map after a kept event ----
    function range(address) {
      return RANGES.find((r) => address >= r[0] && address < r[0] + r[1]);
    }
    function initialState(layout) {
      const segments = new Map();
      for (const [base, size, pool, blocks] of layout) {
        const allocated = new Map();
        const r = range(base);
        const segment = { base, size, pool, allocated };
        if (r) {
          segment.page = r[2];
          segment.mapped = [];
        }
        for (const [address, blockSize, region] of blocks) {
          if (region === 0) allocated.set(address, blockSize);
          if (r && region !== 3) addRun(segment, address, address + blockSize);
        }
        segments.set(base, segment);
      }
      return segments;
    }
    function addRun(segment, start, end) {
      const runs = segment.mapped.concat([[start, end]]).sort((a, b) => a[0] - b[0]);
      const merged = [];
      for (const run of runs) {
        const last = merged[merged.length - 1];
        if (last && run[0] <= last[1]) last[1] = Math.max(last[1], run[1]);
        else merged.push([run[0], run[1]]);
      }
      segment.mapped = merged;
      segment.size = merged.length ? merged[merged.length - 1][1] - segment.base : 0;
    }
    function removeRun(segment, start, end) {
      const out = [];
      for (const [s, e] of segment.mapped) {
        if (e <= start || s >= end) { out.push([s, e]); continue; }
        if (s < start) out.push([s, start]);
        if (e > end) out.push([end, e]);
      }
      segment.mapped = out;
      segment.size = out.length ? out[out.length - 1][1] - segment.base : 0;
    }
    function owner(segments, address) {
      for (const segment of segments.values()) {
        if (address >= segment.base && address < segment.base + segment.size) return segment;
      }
      return null;
    }
    function apply(segments, event) {
      const [code, address, size, pool] = event;
      const kind = KINDS[code];
      if (kind === "segment_alloc") {
        segments.set(address, { base: address, size, pool, allocated: new Map() });
      } else if (kind === "segment_free") {
        segments.delete(address);
      } else if (kind === "segment_map" || kind === "segment_unmap") {
        const r = range(address);
        if (!r) return;
        let segment = segments.get(r[0]);
        if (!segment) {
          segment = { base: r[0], size: 0, pool: r[3], allocated: new Map(), page: r[2], mapped: [] };
          segments.set(r[0], segment);
        }
        if (kind === "segment_map") addRun(segment, address, address + size);
        else removeRun(segment, address, address + size);
        if (segment.size === 0) segments.delete(r[0]);
      } else if (kind === "alloc" || kind === "free_completed") {
        const segment = owner(segments, address);
        if (!segment) return;
        if (kind === "alloc") segment.allocated.set(address, size);
        else segment.allocated.delete(address);
      }
    }
    // The state after k events of stretch w (cached for stepping forwards).
    let cache = null;
    function stateAt(windowIndex, k) {
      const w = windows[windowIndex];
      if (!w.raw.layout) return null;
      if (!cache || cache.window !== windowIndex || cache.k > k) {
        cache = { window: windowIndex, k: 0, segments: initialState(w.raw.layout) };
      }
      while (cache.k < k) {
        apply(cache.segments, w.events[cache.k]);
        cache.k += 1;
      }
      return cache.segments;
    }
    // Bars share one scale per stretch: its largest segment.
    function maxSegment(w) {
      if (w.maxSegment) return w.maxSegment;
      let max = 1;
      for (const segment of w.raw.layout || []) max = Math.max(max, segment[1]);
      for (const [code, address, size] of w.events) {
        const kind = KINDS[code];
        if (kind === "segment_alloc") max = Math.max(max, size);
        if (kind === "segment_map") {
          const r = range(address);
          if (r) max = Math.max(max, address + size - r[0]);
        }
      }
      w.maxSegment = max;
      return max;
    }
    const mapSvg = root.querySelector("svg.map");
    const ROW = 22, LABEL = 345, BAR = 760, MAX_ROWS = 500;
    function freeSpans(segment, from, to, out) {
      if (to <= from) return;
      if (!segment.mapped) {
        out.push([from, to - from, segment.allocated.size > 0 ? "split_free" : "cached_free"]);
        return;
      }
      let at = from;
      for (const [s, e] of segment.mapped) {
        if (e <= at || s >= to) continue;
        if (s > at) out.push([at, s - at, "unmapped"]);
        const a = Math.max(s, at), b = Math.min(e, to);
        const page = segment.page;
        const first = segment.base + Math.ceil((a - segment.base) / page) * page;
        const last = segment.base + Math.floor((b - segment.base) / page) * page;
        if (first >= last) {
          out.push([a, b - a, "split_free"]);
        } else {
          if (first > a) out.push([a, first - a, "split_free"]);
          out.push([first, last - first, "cached_free"]);
          if (b > last) out.push([last, b - last, "split_free"]);
        }
        at = b;
      }
      if (at < to) out.push([at, to - at, "unmapped"]);
    }
    function spans(segment) {
      const pieces = [...segment.allocated.entries()].sort((a, b) => a[0] - b[0]);
      const out = [];
      let at = segment.base;
      for (const [address, size] of pieces) {
        freeSpans(segment, at, address, out);
        out.push([address, size, "allocated"]);
        at = Math.max(at, address + size);
      }
      freeSpans(segment, at, segment.base + segment.size, out);
      return out;
    }
    function drawMap(windowIndex, k) {
      const w = windows[windowIndex];
      const current = stateAt(windowIndex, k);
      if (!current) {
        mapSvg.replaceChildren(el("text", { x: 0, y: 18 }, "no segment map is kept for this stretch (only around the first OOMs and the peaks)"));
        mapSvg.setAttribute("width", "900");
        mapSvg.setAttribute("height", "28");
        return;
      }
      const changed = k > 0 ? w.events[k - 1] : null;
      const scaleMax = maxSegment(w);
      const segments = [...current.values()].sort((a, b) => a.base - b.base);
      const shownSegments = segments.slice(0, MAX_ROWS);
      const parts = [];
      let y = 4;
      for (const segment of shownSegments) {
        const width = Math.max(4, (segment.size / scaleMax) * BAR);
        const allocated = [...segment.allocated.values()].reduce((a, b) => a + b, 0);
        parts.push(el("text", { x: 0, y: y + 14 }, hex(segment.base) + "  " + bytes(segment.size).padStart(9) + " " + POOLS[segment.pool] + "  " + bytes(allocated) + " used"));
        for (const [address, size, region] of spans(segment)) {
          const x = LABEL + ((address - segment.base) / segment.size) * width;
          const rw = Math.max(0.6, (size / segment.size) * width);
          const rect = el("rect", { class: region, x: x.toFixed(2), y, width: rw.toFixed(2), height: ROW - 6 });
          rect.appendChild(el("title", {}, region.replace("_", " ") + " " + bytes(size) + " at " + hex(address)));
          parts.push(rect);
        }
        parts.push(el("rect", { class: "outline", x: LABEL, y, width: width.toFixed(2), height: ROW - 6 }));
        if (changed) {
          const [code, address, size] = changed;
          const kind = KINDS[code];
          if ((kind === "alloc" || kind === "free_requested" || kind === "free_completed" || kind === "segment_alloc") &&
              address >= segment.base && address < segment.base + segment.size) {
            const x = LABEL + ((address - segment.base) / segment.size) * width;
            const cw = Math.max(2, (size / segment.size) * width);
            parts.push(el("rect", { class: "changed", x: x.toFixed(2), y: y - 1, width: cw.toFixed(2), height: ROW - 4 }));
          }
        }
        y += ROW;
      }
      if (segments.length === 0) {
        parts.push(el("text", { x: 0, y: 18 }, "no segments: nothing reserved"));
        y += ROW;
      } else if (segments.length > shownSegments.length) {
        parts.push(el("text", { x: 0, y: y + 14 }, "… and " + (segments.length - shownSegments.length) + " more segments"));
        y += ROW;
      }
      mapSvg.setAttribute("width", String(LABEL + BAR + 10));
      mapSvg.setAttribute("height", String(y + 4));
      mapSvg.setAttribute("viewBox", "0 0 " + (LABEL + BAR + 10) + " " + (y + 4));
      mapSvg.replaceChildren(...parts);
    }

    // ---- selection: an event number, and the kept event there if any ----
    const slider = root.querySelector(".slider");
    const info = root.querySelector(".event-info");
    const indexText = root.querySelector(".event-index");
    const selection = { position: FROM, window: -1, k: 0, eventIndex: undefined };
    // Selects the last event at `position` (or `eventIndex` of its stretch) for the map.
    function select(position, eventIndex) {
      selection.position = position;
      selection.eventIndex = eventIndex;
      const index = windowAt(position);
      selection.window = index;
      if (index >= 0) {
        const w = windows[index];
        let k = eventIndex !== undefined ? eventIndex + 1 : lowerBound(w, position + 1);
        selection.k = k;
        slider.disabled = false;
        slider.max = String(w.n);
        slider.value = String(k);
      } else {
        slider.disabled = true;
      }
      render();
    }
    function step(delta) {
      if (selection.window < 0) return;
      const w = windows[selection.window];
      const k = Math.max(0, Math.min(w.n, selection.k + delta));
      selection.k = k;
      selection.position = k > 0 ? w.pos[k - 1] : w.firstPos;
      selection.eventIndex = k > 0 ? k - 1 : undefined;
      slider.value = String(k);
      render();
      if (selection.position < zoom.from || selection.position >= zoom.to) focus(selection.position, zoom.to - zoom.from, selection.eventIndex);
      else drawZoom();
    }
    slider.addEventListener("input", () => {
      if (selection.window < 0) return;
      selection.k = Number(slider.value) - 1;
      step(1);
    });
    function render() {
      if (selection.window < 0) {
        indexText.textContent = numberText(selection.position);
        const r = over(selection.position, selection.position + 1);
        info.replaceChildren(line(numberText(selection.position) + ": the recorder kept only the envelope here" +
          (r ? " (allocated " + bytes(r[0]) + " – " + bytes(r[1]) + ", reserved " + bytes(r[2]) + " – " + bytes(r[3]) + ")" : "") +
          "; every event is kept around each OOM and both peaks"));
        mapSvg.replaceChildren();
        return;
      }
      const w = windows[selection.window];
      const k = selection.k;
      if (k === 0) {
        indexText.textContent = (w.raw.first === 0 ? "the start" : "the stretch's start, before " + numberText(w.firstPos));
        const [a, b] = w.raw.before;
        info.replaceChildren(line((w.raw.first === 0 ? "start of the recording" : "before " + numberText(w.firstPos)) +
          " — allocated " + bytes(a) + ", reserved " + bytes(b)));
      } else {
        indexText.textContent = numberText(w.pos[k - 1]) + (data.complete ? " of " + (trace ? "the file" : data.counts.events) : "");
        const [text, cls] = describeEvent(w, k - 1);
        const node = line(text);
        if (cls === "m") node.className = "oom";
        info.replaceChildren(node);
      }
      drawMap(selection.window, k);
    }

    // Start on the first OOM if there is one, else where allocated memory peaked.
    if (ooms.length) {
      jump(ooms[0][0], (w, i) => KINDS[w.events[i][0]] === "oom");
    } else if (data.complete) {
      select(data.peaks.allocated[1], undefined);
      if (windowAt(data.peaks.allocated[1]) >= 0) {
        const w = windows[windowAt(data.peaks.allocated[1])];
        for (let i = 0; i < w.n; i++) if (w.alloc[i] === data.peaks.allocated[0]) { select(w.pos[i], i); break; }
      }
      drawZoom();
    } else {
      jump(data.peaks.allocated[1], (w, i) => w.alloc[i] === data.peaks.allocated[0]);
    }
  }

  document.querySelectorAll("section.panel").forEach((section) => {
    const data = DATA.panels[Number(section.dataset.panel)];
    if (data) Panel(section, data);
  });
  document.body.dataset.readyMs = String(Math.round(performance.now()));
  document.body.dataset.ready = "1";
})();
