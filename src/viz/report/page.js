// gpumem report: the timeline's hover and click, and the segment map at any event, rebuilt
// from the layout at the start plus the events (no request leaves the page).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("data").textContent);
  const KINDS = data.kinds;
  const events = data.events; // [kind, address, size, pool, allocated, reserved, context]
  const N = events.length;
  const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

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
  function label(context) {
    return context > 0 && context <= data.labels.length ? data.labels[context - 1] : "";
  }
  function escapeText(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }
  const POOLS = ["small", "large"];

  // One event in words: "alloc 4 MiB at 0x7f.. (large pool)".
  function describe(k) {
    if (k === 0) {
      return { kind: "start", text: "start of the recording", where: "" };
    }
    const [code, address, size, pool, , , context] = events[k - 1];
    const kind = KINDS[code];
    let text;
    switch (kind) {
      case "oom": text = "out of memory: a " + bytes(size) + " segment could not be had"; break;
      case "empty_cache": text = "empty_cache() called"; break;
      default: text = kind + " " + bytes(size) + " at " + hex(address) + " (" + POOLS[pool] + " pool)";
    }
    return { kind, text, where: label(context) };
  }
  function figures(k) {
    return k === 0 ? [data.initial.allocated, data.initial.reserved] : [events[k - 1][4], events[k - 1][5]];
  }

  // ---- the layout after k events ----
  // A segment: {base, size, pool, allocated: Map(address -> size)}; an expandable one also has
  // its page size and its mapped runs [[start, end], ...] (size = end of the last one).
  const RANGES = data.expandable || []; // [base, reserved, page, pool]
  function range(address) {
    return RANGES.find((r) => address >= r[0] && address < r[0] + r[1]);
  }
  function initialState() {
    const segments = new Map();
    for (const [base, size, pool, blocks] of data.initial.segments) {
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
    return { k: 0, segments };
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
  function apply(state, event) {
    const [code, address, size, pool] = event;
    const kind = KINDS[code];
    const segments = state.segments;
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
  let state = initialState();
  function stateAt(k) {
    if (k < state.k) state = initialState();
    while (state.k < k) {
      apply(state, events[state.k]);
      state.k += 1;
    }
    return state;
  }

  // ---- the map ----
  // Bars share one scale: the largest segment of the run (an expandable one up to the end
  // of the highest page it ever mapped).
  let maxSegment = 1;
  for (const segment of data.initial.segments) maxSegment = Math.max(maxSegment, segment[1]);
  for (const [code, address, size] of events) {
    const kind = KINDS[code];
    if (kind === "segment_alloc") maxSegment = Math.max(maxSegment, size);
    if (kind === "segment_map") {
      const r = range(address);
      if (r) maxSegment = Math.max(maxSegment, address + size - r[0]);
    }
  }
  const svg = document.getElementById("map");
  const NS = "http://www.w3.org/2000/svg";
  const ROW = 22, LABEL = 345, BAR = 760, MAX_ROWS = 500;

  // Free bytes [from, to) of a segment: in an expandable one, whole pages are cached free
  // (empty_cache() unmaps them), partial pages split free, and unmapped bytes unmapped.
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
  function drawMap(k) {
    const current = stateAt(k);
    const changed = k > 0 ? events[k - 1] : null;
    const segments = [...current.segments.values()].sort((a, b) => a.base - b.base);
    const shown = segments.slice(0, MAX_ROWS);
    const parts = [];
    let y = 4;
    for (const segment of shown) {
      const width = Math.max(4, (segment.size / maxSegment) * BAR);
      const allocated = [...segment.allocated.values()].reduce((a, b) => a + b, 0);
      parts.push(
        '<text x="0" y="' + (y + 14) + '">' + hex(segment.base) + "  " + escapeText(bytes(segment.size)).padStart(9) +
          " " + POOLS[segment.pool] + "  " + escapeText(bytes(allocated)) + " used</text>"
      );
      for (const [address, size, region] of spans(segment)) {
        const x = LABEL + ((address - segment.base) / segment.size) * width;
        const w = Math.max(0.6, (size / segment.size) * width);
        parts.push(
          '<rect class="' + region + '" x="' + x.toFixed(2) + '" y="' + y + '" width="' + w.toFixed(2) +
            '" height="' + (ROW - 6) + '"><title>' + region.replace("_", " ") + " " + escapeText(bytes(size)) +
            " at " + hex(address) + "</title></rect>"
        );
      }
      parts.push('<rect class="outline" x="' + LABEL + '" y="' + y + '" width="' + width.toFixed(2) + '" height="' + (ROW - 6) + '"/>');
      if (changed) {
        const [code, address, size] = changed;
        const kind = KINDS[code];
        if ((kind === "alloc" || kind === "free_requested" || kind === "free_completed" || kind === "segment_alloc") &&
            address >= segment.base && address < segment.base + segment.size) {
          const x = LABEL + ((address - segment.base) / segment.size) * width;
          const w = Math.max(2, (size / segment.size) * width);
          parts.push('<rect class="changed" x="' + x.toFixed(2) + '" y="' + (y - 1) + '" width="' + w.toFixed(2) + '" height="' + (ROW - 4) + '"/>');
        }
      }
      y += ROW;
    }
    if (segments.length === 0) {
      parts.push('<text x="0" y="18">no segments: nothing reserved</text>');
      y += ROW;
    } else if (segments.length > shown.length) {
      parts.push('<text x="0" y="' + (y + 14) + '">… and ' + (segments.length - shown.length) + " more segments</text>");
      y += ROW;
    }
    svg.setAttribute("width", String(LABEL + BAR + 10));
    svg.setAttribute("height", String(y + 4));
    svg.setAttribute("viewBox", "0 0 " + (LABEL + BAR + 10) + " " + (y + 4));
    svg.innerHTML = parts.join("");
  }

  // ---- slider, buttons, event text ----
  const slider = document.getElementById("slider");
  const info = document.getElementById("event-info");
  const indexText = document.getElementById("event-index");
  slider.max = String(N);
  function show(k) {
    k = Math.max(0, Math.min(N, k | 0));
    slider.value = String(k);
    const d = describe(k);
    const [allocated, reserved] = figures(k);
    indexText.textContent = k + " of " + N;
    info.innerHTML =
      '<span class="kind ' + d.kind + '">' + escapeText(d.text) + "</span>" +
      (d.where ? " — " + escapeText(d.where) : "") +
      " — allocated " + escapeText(bytes(allocated)) + ", reserved " + escapeText(bytes(reserved));
    drawMap(k);
  }
  slider.addEventListener("input", () => show(Number(slider.value)));
  document.getElementById("prev").addEventListener("click", () => show(Number(slider.value) - 1));
  document.getElementById("next").addEventListener("click", () => show(Number(slider.value) + 1));
  const marked = [];
  events.forEach((e, i) => {
    const kind = KINDS[e[0]];
    if (kind === "oom" || kind === "empty_cache") marked.push(i + 1);
  });
  document.getElementById("next-mark").addEventListener("click", () => {
    const k = Number(slider.value);
    const next = marked.find((m) => m > k);
    if (next !== undefined) show(next);
  });
  document.getElementById("prev-mark").addEventListener("click", () => {
    const k = Number(slider.value);
    const previous = marked.filter((m) => m < k).pop();
    if (previous !== undefined) show(previous);
  });

  // ---- the chart's hover and click ----
  const wrap = document.getElementById("chart-wrap");
  const chart = wrap.querySelector("svg");
  const cursor = document.getElementById("cursor");
  const tip = document.getElementById("tip");
  const g = data.geometry;
  function pointAt(clientX) {
    const rect = chart.getBoundingClientRect();
    const scale = g.width / rect.width;
    const x = (clientX - rect.left) * scale;
    const k = Math.round(((x - g.left) / (g.right - g.left)) * g.points);
    return { k: Math.max(0, Math.min(N, k)), rect, scale };
  }
  if (chart) {
    chart.addEventListener("mousemove", (event) => {
      const { k, rect, scale } = pointAt(event.clientX);
      const d = describe(k);
      const [allocated, reserved] = figures(k);
      // Positions relative to the wrapper (SVG elements have no offsetLeft/offsetTop).
      const origin = wrap.getBoundingClientRect();
      const chartLeft = rect.left - origin.left;
      const chartTop = rect.top - origin.top;
      const x = chartLeft + (g.left + (k / g.points) * (g.right - g.left)) / scale;
      const top = chartTop + g.top / scale;
      cursor.style.display = "block";
      cursor.style.left = x + "px";
      cursor.style.top = top + "px";
      cursor.style.height = (g.bottom - g.top) / scale + "px";
      tip.innerHTML =
        "<b>#" + k + "</b> " + escapeText(d.text) + (d.where ? "<br>" + escapeText(d.where) : "") +
        "<br>allocated " + escapeText(bytes(allocated)) + " · reserved " + escapeText(bytes(reserved));
      tip.style.display = "block";
      const right = chartLeft + rect.width - tip.offsetWidth - 4;
      tip.style.left = (x + 12 > right ? x - tip.offsetWidth - 12 : x + 12) + "px";
      tip.style.top = top + 8 + "px";
    });
    chart.addEventListener("mouseleave", () => {
      cursor.style.display = "none";
      tip.style.display = "none";
    });
    chart.addEventListener("click", (event) => show(pointAt(event.clientX).k));
  }

  // Start on the first OOM if there is one, else where allocated memory peaked.
  let start = N;
  const oom = events.findIndex((e) => KINDS[e[0]] === "oom");
  if (oom >= 0) {
    start = oom + 1;
  } else {
    let best = -1;
    events.forEach((e, i) => {
      if (e[4] > best) { best = e[4]; start = i + 1; }
    });
  }
  show(start);
  document.body.dataset.ready = "1";
})();
