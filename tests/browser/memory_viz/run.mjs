// memviz harness: load memory-snapshot pickles into PyTorch's memory visualizer
// (torch/utils/viz/MemoryViz.js) in headless Chromium, the way `python -m torch.cuda._memory_viz`'s
// HTML does (add_local_files([{name, base64}], view)), once per pickle and view, and record
// console errors, uncaught exceptions, rendered SVG element counts and screenshots. In the
// "Allocator State History" view it also selects events (first, middle, last and a sample or all
// of the others), which runs simulate_memory backwards over the trace from the snapshot's
// segments, the code that throws on an inconsistent trace.
//
// Usage:
//   node run.mjs --root DIR --out DIR [--chromium /usr/bin/chromium] [--views a,b,c]
//                [--max-select N] PICKLE...
// --root holds MemoryViz.js (imports patched to read a global d3) and node_modules/d3/dist/d3.min.js.
// Needs puppeteer-core (npm install puppeteer-core d3@5 in --root or above this file).
// Exit status: 0 when every case had no console error and no uncaught exception, 1 otherwise.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import puppeteer from 'puppeteer-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const ALL_VIEWS = [
  'Active Memory Timeline',
  'Allocator State History',
  'Active Cached Segment Timeline',
];

function parseArgs(argv) {
  const o = {
    root: path.resolve(here, '..'),
    out: path.resolve(here, '..', 'out'),
    chromium: '/usr/bin/chromium',
    views: ALL_VIEWS,
    maxSelect: 400,
    pickles: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--root') o.root = path.resolve(argv[++i]);
    else if (a === '--out') o.out = path.resolve(argv[++i]);
    else if (a === '--chromium') o.chromium = argv[++i];
    else if (a === '--views') o.views = argv[++i].split(',');
    else if (a === '--max-select') o.maxSelect = Number(argv[++i]);
    else o.pickles.push(path.resolve(a));
  }
  return o;
}

const opts = parseArgs(process.argv.slice(2));
fs.mkdirSync(path.join(opts.out, 'shots'), {recursive: true});
const template = fs.readFileSync(path.join(here, 'page.html'), 'utf8');

// _format_viz: buffer += b"\x00" * (3 - len(buffer) % 3); base64; json.dumps([{name, base64}]);
// template.replace("$VIZ_KIND", repr(viz_kind)).replace("$SNAPSHOT", json_format)
function formatViz(bytes, name, view) {
  const pad = Buffer.alloc(3 - (bytes.length % 3));
  const b64 = Buffer.concat([bytes, pad]).toString('base64');
  const json = JSON.stringify([{name, base64: b64}]);
  const kind = `'${view}'`;
  return template.split('$VIZ_KIND').join(kind).split('$SNAPSHOT').join(json);
}

const cases = new Map(); // id -> html
const requests404 = [];
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const send = (type, body) => {
    res.writeHead(200, {'content-type': type, 'cache-control': 'no-store'});
    res.end(body);
  };
  if (url.pathname === '/d3.min.js') {
    send('text/javascript', fs.readFileSync(path.join(opts.root, 'node_modules/d3/dist/d3.min.js')));
  } else if (url.pathname === '/MemoryViz.js') {
    send('text/javascript', fs.readFileSync(path.join(opts.root, 'MemoryViz.js')));
  } else if (url.pathname === '/favicon.ico') {
    res.writeHead(204);
    res.end();
  } else if (url.pathname.startsWith('/case/') && cases.has(url.pathname.slice(6))) {
    send('text/html', cases.get(url.pathname.slice(6)));
  } else {
    requests404.push(req.url);
    res.writeHead(404);
    res.end();
  }
});
await new Promise(r => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const userDataDir = fs.mkdtempSync('/tmp/memviz-chromium-');
const browser = await puppeteer.launch({
  executablePath: opts.chromium,
  headless: true,
  userDataDir,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});

const slug = s => s.replace(/[^A-Za-z0-9._-]+/g, '_');
const sleep = ms => new Promise(r => setTimeout(r, ms));

// Element counts inside the visible view (the div add_local_files shows), or the whole page.
function countElements() {
  const divs = [...document.querySelectorAll('body > div')].filter(
    d => d.style.display !== 'none' && d.querySelector('svg'),
  );
  const root = divs.length > 0 ? divs[0] : document;
  const n = sel => root.querySelectorAll(sel).length;
  const svgs = [...root.querySelectorAll('svg')];
  return {
    svg: n('svg'),
    rect: n('svg rect'),
    path: n('svg path'),
    polygon: n('svg polygon'),
    line: n('svg line'),
    text: n('svg text'),
    pre: n('pre'),
    per_svg: svgs.map(s => ({
      rect: s.querySelectorAll('rect').length,
      path: s.querySelectorAll('path').length,
      polygon: s.querySelectorAll('polygon').length,
    })),
    gpu_options: [...document.querySelectorAll('body > select')].map(s =>
      [...s.options].map(o => o.text),
    ),
  };
}

async function errorsSince(page, from) {
  return page.evaluate(k => window.__memviz_errors.slice(k), from);
}

async function exerciseSegmentView(page, maxSelect) {
  // The events list is the first grid cell's div of <pre>; the stack text is the grid's <pre>.
  return page.evaluate(async maxSelect => {
    const grid = [...document.querySelectorAll('body > div')]
      .filter(d => d.style.display !== 'none')
      .map(d => d.firstElementChild)
      .find(g => g && g.style.display === 'grid');
    if (!grid) return {error: 'no segment view grid'};
    const stack = [...grid.children].find(c => c.tagName === 'PRE');
    const list = [...grid.children].find(c => c.tagName === 'DIV');
    const svg = grid.querySelector('svg');
    const pres = [...list.children];
    const n = pres.length;
    const picks = new Set();
    if (n > 0) {
      picks.add(0);
      picks.add(Math.floor((n - 1) / 2));
      picks.add(n - 1);
      if (n <= maxSelect) {
        for (let i = 0; i < n; i++) picks.add(i);
      } else {
        for (let k = 0; k < maxSelect; k++) picks.add(Math.floor((k * (n - 1)) / (maxSelect - 1)));
      }
    }
    const order = [...picks].sort((a, b) => a - b);
    const failures = [];
    const summary = {};
    const firstLine = () => (stack.textContent || '').split('\n')[0];
    const trail = []; // [idx, event text, "(allocated / reserved)", rect count] per selected event
    for (const idx of order) {
      const before = window.__memviz_errors.length;
      window.__memviz_context = `select event ${idx}`;
      pres[idx].dispatchEvent(new MouseEvent('mousedown', {bubbles: true, view: window}));
      const errs = window.__memviz_errors.slice(before);
      trail.push([idx, pres[idx].textContent, firstLine(), svg.querySelectorAll('rect').length]);
      if (errs.length > 0) {
        failures.push({idx, event: pres[idx].textContent, errors: errs.map(e => e.message)});
      }
      if (idx === 0 || idx === n - 1 || idx === Math.floor((n - 1) / 2)) {
        summary[idx] = {
          event: pres[idx].textContent,
          stack_first_line: firstLine(),
          rects: svg.querySelectorAll('rect').length,
          errors: errs.map(e => e.message),
        };
      }
    }
    // Hover: event list entries (eventStack), segment and block rects (format_frames etc.).
    const hoverFailures = [];
    const hover = (els, what) => {
      for (const el of els) {
        const before = window.__memviz_errors.length;
        window.__memviz_context = `mouseover ${what}`;
        el.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, view: window}));
        el.dispatchEvent(new MouseEvent('mouseleave', {bubbles: false, view: window}));
        const errs = window.__memviz_errors.slice(before);
        if (errs.length > 0) hoverFailures.push({what, errors: errs.map(e => e.message)});
      }
    };
    const sample = (arr, k) =>
      arr.length <= k ? arr : Array.from({length: k}, (_, i) => arr[Math.floor((i * (arr.length - 1)) / (k - 1))]);
    // Select the middle event last so its state is what the screenshot shows.
    const mid = Math.floor((n - 1) / 2);
    if (n > 0) {
      window.__memviz_context = `select event ${mid} (for screenshot)`;
      pres[mid].dispatchEvent(new MouseEvent('mousedown', {bubbles: true, view: window}));
    }
    hover(sample(pres, 100), 'event list entry');
    const groups = [...svg.querySelectorAll('g > g')];
    hover(sample(groups[0] ? [...groups[0].querySelectorAll('rect')] : [], 100), 'segment rect');
    hover(sample(groups[1] ? [...groups[1].querySelectorAll('rect')] : [], 100), 'block rect');
    hover(sample(groups[2] ? [...groups[2].querySelectorAll('rect')] : [], 100), 'rounding rect');
    // Keyboard: ArrowUp / ArrowDown move the selection.
    for (const key of ['ArrowUp', 'ArrowUp', 'ArrowDown']) {
      const before = window.__memviz_errors.length;
      window.__memviz_context = `keydown ${key}`;
      document.body.dispatchEvent(new KeyboardEvent('keydown', {key, bubbles: true}));
      const errs = window.__memviz_errors.slice(before);
      if (errs.length > 0) hoverFailures.push({what: `keydown ${key}`, errors: errs.map(e => e.message)});
    }
    // Back to the middle event for the screenshot.
    if (n > 0) pres[mid].dispatchEvent(new MouseEvent('mousedown', {bubbles: true, view: window}));
    return {
      events: n,
      selected: order.length,
      failures: failures.slice(0, 20),
      failure_count: failures.length,
      hover_failures: hoverFailures.slice(0, 20),
      hover_failure_count: hoverFailures.length,
      summary,
      trail,
      mid_rects_after: svg.querySelectorAll('rect').length,
    };
  }, maxSelect);
}

async function exerciseTraceView(page, shotBase) {
  const r = await page.evaluate(() => {
    const polys = [...document.querySelectorAll('svg polygon')];
    const plotPolys = polys.slice(0, Math.max(0, polys.length - 1)); // the last one is the minimap
    const sample =
      plotPolys.length <= 200
        ? plotPolys
        : Array.from({length: 200}, (_, i) => plotPolys[Math.floor((i * (plotPolys.length - 1)) / 199)]);
    const failures = [];
    let contexts = 0;
    let firstContext = null;
    const pre = [...document.querySelectorAll('pre')].at(-1);
    for (const p of sample) {
      const before = window.__memviz_errors.length;
      window.__memviz_context = 'mouseover polygon';
      p.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, view: window}));
      p.dispatchEvent(new MouseEvent('mousedown', {bubbles: true, view: window}));
      window.dispatchEvent(new MouseEvent('mouseup', {bubbles: true, view: window})); // ends d3-zoom's gesture
      p.dispatchEvent(new MouseEvent('mouseleave', {bubbles: false, view: window}));
      const errs = window.__memviz_errors.slice(before);
      if (errs.length > 0) failures.push(errs.map(e => e.message));
      else contexts++;
      if (firstContext === null && pre && pre.textContent && !pre.textContent.startsWith('Small tensors')) {
        firstContext = pre.textContent.slice(0, 400);
      }
    }
    // Hover the biggest polygon last, so the screenshot shows a context text.
    if (sample.length > 0) {
      window.__memviz_context = 'mouseover polygon (for screenshot)';
      sample[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true, view: window}));
    }
    return {hovered: sample.length, ok: contexts, failures: failures.slice(0, 20), failure_count: failures.length, first_context: firstContext};
  });
  // Brush the minimap (second svg) with the real mouse: select_window.
  const before = (await page.evaluate(() => window.__memviz_errors.length));
  await page.evaluate(() => (window.__memviz_context = 'brush minimap'));
  const box = await page.evaluate(() => {
    const svgs = [...document.querySelectorAll('svg')];
    const m = svgs[1];
    if (!m) return null;
    const b = m.getBoundingClientRect();
    return {x: b.x, y: b.y, w: b.width, h: b.height};
  });
  if (box && box.w > 0 && box.h > 0) {
    const y = box.y + box.h / 2;
    // 20%..80% of the minimap: a brush narrower than one timestep makes select_window divide by
    // a window maximum of 0 (scale(NaN)), with PyTorch's own snapshots too.
    await page.mouse.move(box.x + box.w * 0.2, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.w * 0.5, y, {steps: 5});
    await page.mouse.move(box.x + box.w * 0.8, y, {steps: 5});
    await page.mouse.up();
    await sleep(200);
    await page.screenshot({path: `${shotBase}-brush.png`});
  }
  r.brush_errors = (await errorsSince(page, before)).map(e => e.message);
  // Detail slider to 10 (create_trace_view again, with the rest summarized).
  const before2 = (await page.evaluate(() => window.__memviz_errors.length));
  r.detail10 = await page.evaluate(() => {
    window.__memviz_context = 'detail slider 10';
    const input = document.querySelector('input[type=range]');
    if (!input) return null;
    input.value = 10;
    input.dispatchEvent(new Event('change'));
    return {polygons: document.querySelectorAll('svg polygon').length};
  });
  r.detail_errors = (await errorsSince(page, before2)).map(e => e.message);
  return r;
}

const results = [];
for (const file of opts.pickles) {
  const bytes = fs.readFileSync(file);
  const name = path.basename(file);
  for (const view of opts.views) {
    const id = `${slug(name)}__${slug(view)}`;
    cases.set(`${id}.html`, formatViz(bytes, name, view));
    const ctx = await browser.createBrowserContext();
    const page = await ctx.newPage();
    await page.setViewport({width: 1400, height: 1000});
    const consoleMsgs = [];
    const pageErrors = [];
    const failedRequests = [];
    let logCount = 0;
    let phase = 'load';
    page.on('console', m => {
      if (m.type() === 'log' || m.type() === 'debug' || m.type() === 'info') logCount++;
      else consoleMsgs.push(`[${phase}] ${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', e => pageErrors.push(`[${phase}] ${String(e && e.message ? e.message : e)}`));
    page.on('requestfailed', r => failedRequests.push(`${r.url()} ${r.failure()?.errorText}`));
    const t0 = Date.now();
    const rec = {pickle: file, name, view, id};
    try {
      await page.goto(`${base}/case/${id}.html`, {waitUntil: 'load', timeout: 180000});
      await page.waitForFunction(
        () => window.__memviz_loaded === true || window.__memviz_errors.length > 0,
        {timeout: 180000, polling: 100},
      );
      // create_segment_view selects the last event in a requestAnimationFrame.
      await page.evaluate(() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))));
      await sleep(300);
      rec.loaded = await page.evaluate(() => window.__memviz_loaded === true);
      rec.counts = await page.evaluate(countElements);
      rec.screenshot = path.join(opts.out, 'shots', `${id}.png`);
      await page.screenshot({path: rec.screenshot});
      rec.load_errors = await errorsSince(page, 0);
      const nLoad = rec.load_errors.length;
      await sleep(100);
      phase = 'exercise';
      if (view === 'Allocator State History') {
        rec.exercise = await exerciseSegmentView(page, opts.maxSelect);
        await sleep(200);
        rec.screenshot_mid = path.join(opts.out, 'shots', `${id}-mid.png`);
        await page.screenshot({path: rec.screenshot_mid});
      } else {
        rec.exercise = await exerciseTraceView(page, path.join(opts.out, 'shots', id));
        rec.screenshot_brush = path.join(opts.out, 'shots', `${id}-brush.png`);
      }
      await sleep(200);
      phase = 'done';
      rec.exercise_errors = (await errorsSince(page, nLoad)).map(e => `[${e.context}] ${e.message}`);
    } catch (e) {
      rec.harness_error = String(e && e.stack ? e.stack : e);
    }
    rec.console_errors = consoleMsgs;
    rec.page_errors = pageErrors;
    rec.failed_requests = failedRequests;
    rec.console_log_count = logCount;
    rec.seconds = (Date.now() - t0) / 1000;
    results.push(rec);
    await ctx.close();
    cases.delete(`${id}.html`);
    const errs = rec.page_errors.length + rec.console_errors.length + (rec.harness_error ? 1 : 0);
    const c = rec.counts || {};
    console.log(
      `${errs === 0 ? 'OK  ' : 'FAIL'} ${name} | ${view} | rect ${c.rect} path ${c.path} polygon ${c.polygon} pre ${c.pre}` +
        (rec.exercise && rec.exercise.events !== undefined
          ? ` | selected ${rec.exercise.selected}/${rec.exercise.events} events, ${rec.exercise.failure_count} failed`
          : '') +
        (errs ? ` | ${[...rec.page_errors, ...rec.console_errors, rec.harness_error || ''].filter(Boolean).slice(0, 3).join(' || ')}` : '') +
        ` | ${rec.seconds.toFixed(1)} s`,
    );
  }
}

await browser.close();
server.close();
fs.rmSync(userDataDir, {recursive: true, force: true});
fs.writeFileSync(path.join(opts.out, 'results.json'), JSON.stringify({requests404, results}, null, 2));
console.log(`results: ${path.join(opts.out, 'results.json')}; 404s: ${JSON.stringify(requests404)}`);
const bad = results.some(r => r.page_errors.length || r.console_errors.length || r.harness_error);
process.exit(bad ? 1 : 0);
