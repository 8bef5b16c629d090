// Opens a gpumem HTML report in headless Chromium through the Chrome DevTools Protocol over
// --remote-debugging-pipe (no port, no npm package), and prints one JSON object: every
// request the page made other than loading its own file, console messages of every level,
// uncaught exceptions and JavaScript dialogs (alert, confirm, prompt), how long the page took
// to be ready, what each timeline panel shows (its label, subtitle, the drawn peaks and the
// event shown after its "peak" and "OOM" buttons), the tooltip shown when hovering the first
// timeline, the page's visible text, whether the global `window.__planted` was touched, and
// where the screenshot was written.
//
//   node tests/browser/check_report.mjs REPORT.html SCREENSHOT.png
//
// Chromium: $CHROMIUM, else /usr/bin/chromium (Debian's package). Runs headless, sandbox and
// GPU off, every background network feature off, with a fresh profile folder.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [reportPath, screenshotPath] = process.argv.slice(2);
if (!reportPath || !screenshotPath) {
  console.error("usage: check_report.mjs REPORT.html SCREENSHOT.png");
  process.exit(2);
}
const reportUrl = pathToFileURL(path.resolve(reportPath)).href;
const chromium = process.env.CHROMIUM || "/usr/bin/chromium";
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "gpumem-chromium-"));
const browser = spawn(
  chromium,
  [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    `--user-data-dir=${profile}`,
    "--remote-debugging-pipe",
    "about:blank",
  ],
  // Chromium reads protocol messages from fd 3 and writes them to fd 4, each ended by NUL.
  // Its own temporary files (the singleton socket folder) go into the profile too, so that
  // removing the profile leaves nothing in the system's temporary folder.
  { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], env: { ...process.env, TMPDIR: profile } }
);

function finish(code, result) {
  browser.removeAllListeners("exit");
  if (result) console.log(JSON.stringify(result));
  // The profile goes once the browser is gone: removing it earlier races with its last writes.
  let done = false;
  const cleanUp = () => {
    if (done) return;
    done = true;
    try { fs.rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 }); } catch {}
    process.exit(code);
  };
  if (browser.exitCode !== null || browser.signalCode !== null) return cleanUp();
  browser.once("exit", cleanUp);
  setTimeout(cleanUp, 5000);
  try { browser.kill("SIGKILL"); } catch { cleanUp(); }
}
const deadline = setTimeout(() => {
  console.error("check_report: timed out");
  finish(3);
}, 90_000);

let stderrText = "";
browser.stderr.on("data", (chunk) => { stderrText += chunk; });
browser.on("exit", (code) => {
  console.error(`check_report: chromium exited (${code}): ${stderrText}`);
  finish(3);
});
const toBrowser = browser.stdio[3];
const fromBrowser = browser.stdio[4];
let nextId = 1;
const pending = new Map();
const listeners = [];
let buffered = Buffer.alloc(0);
fromBrowser.on("data", (chunk) => {
  buffered = Buffer.concat([buffered, chunk]);
  let end;
  while ((end = buffered.indexOf(0)) >= 0) {
    const data = JSON.parse(buffered.subarray(0, end).toString("utf8"));
    buffered = buffered.subarray(end + 1);
    if (data.id && pending.has(data.id)) {
      const { resolve, reject } = pending.get(data.id);
      pending.delete(data.id);
      if (data.error) reject(new Error(JSON.stringify(data.error)));
      else resolve(data.result);
    } else if (data.method) {
      for (const listener of listeners) listener(data);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  toBrowser.write(JSON.stringify({ id, method, params, sessionId }) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}

const requests = [];
const errors = [];
const messages = [];
const dialogs = [];
let loaded = false;
listeners.push((event) => {
  const p = event.params || {};
  switch (event.method) {
    case "Network.requestWillBeSent":
      requests.push(p.request.url);
      break;
    case "Runtime.consoleAPICalled": {
      const text = "console." + p.type + ": " + (p.args || []).map((a) => a.value ?? a.description).join(" ");
      messages.push(text);
      if (p.type === "error" || p.type === "assert") errors.push(text);
      break;
    }
    case "Page.javascriptDialogOpening":
      // Recorded, then dismissed so the page goes on.
      dialogs.push(p.type + ": " + p.message);
      send("Page.handleJavaScriptDialog", { accept: true }, event.sessionId).catch(() => {});
      break;
    case "Runtime.exceptionThrown":
      errors.push("exception: " + (p.exceptionDetails.exception?.description || p.exceptionDetails.text));
      break;
    case "Log.entryAdded":
      if (p.entry.level === "error") errors.push("log: " + p.entry.text + " " + (p.entry.url || ""));
      break;
    case "Page.loadEventFired":
      loaded = true;
      break;
  }
});

try {
  const { targetId } = await send("Target.createTarget", { url: "about:blank" });
  const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
  const page = (method, params) => send(method, params, sessionId);
  await page("Network.enable");
  await page("Runtime.enable");
  await page("Log.enable");
  await page("Page.enable");
  await page("Emulation.setDeviceMetricsOverride", { width: 1400, height: 1000, deviceScaleFactor: 1, mobile: false });
  const started = Date.now();
  await page("Page.navigate", { url: reportUrl });
  const evaluate = async (expression) =>
    (await page("Runtime.evaluate", { expression, returnByValue: true })).result.value;
  for (let i = 0; i < 600 && !(loaded && (await evaluate("document.body && document.body.dataset.ready")) === "1"); i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  const loadMs = Date.now() - started;
  const metrics = await evaluate(`(() => {
    const size = (el) => { if (!el) return null; const b = el.getBoundingClientRect(); return { width: b.width, height: b.height, x: b.x, y: b.y }; };
    const first = document.querySelector("section.panel");
    const chart = first && first.querySelector(".chart-wrap svg");
    return {
      ready: document.body.dataset.ready || "",
      readyMs: Number(document.body.dataset.readyMs || -1),
      navigation: (() => { const n = performance.getEntriesByType("navigation")[0]; return n ? { responseEnd: Math.round(n.responseEnd), domInteractive: Math.round(n.domInteractive), domContentLoaded: Math.round(n.domContentLoadedEventEnd), load: Math.round(n.loadEventEnd), scriptStart: Number(document.body.dataset.scriptStartMs || -1) } : null; })(),
      chart: size(chart),
      chartShapes: chart ? chart.querySelectorAll("polyline, path, polygon, line").length : 0,
      map: size(first && first.querySelector("svg.map")),
      mapRects: first ? first.querySelectorAll("svg.map rect").length : 0,
      mapSegments: first ? first.querySelectorAll("svg.map rect.outline").length : 0,
      zoom: size(first && first.querySelector("svg.zoom")),
      slider: first ? Number(first.querySelector(".slider").max) : 0,
      // The zoomed view's marker labels, and how many times one crosses a marker's line.
      zoomLabels: first ? [...first.querySelectorAll("svg.zoom text.marker-label")].map((t) => t.textContent) : [],
      zoomCrossings: first ? (() => {
        const lines = [...first.querySelectorAll("svg.zoom line.marker")].map((l) => { const b = l.getBoundingClientRect(); return (b.left + b.right) / 2; });
        let crossings = 0;
        for (const t of first.querySelectorAll("svg.zoom text.marker-label")) {
          const b = t.getBoundingClientRect();
          crossings += lines.filter((x) => x > b.left + 0.5 && x < b.right - 0.5).length;
        }
        return crossings;
      })() : 0,
      summary: first ? first.querySelector("pre.summary").textContent.length : 0,
      subtitle: document.querySelector("header .sub").textContent,
      title: document.querySelector("h1").textContent,
      comparison: [...document.querySelectorAll("table.compare tr")].map((tr) => [...tr.children].map((c) => c.textContent)),
      planted: typeof window.__planted === "undefined" ? null : String(window.__planted),
      text: document.body.innerText,
      // Every text node outside the page's own scripts, shown or folded away (details).
      shownText: (() => { const copy = document.body.cloneNode(true); copy.querySelectorAll("script").forEach((s) => s.remove()); return copy.textContent; })(),
      scripts: document.scripts.length,
    };
  })()`);
  // Hover the middle of the first chart's plot: the tooltip must name an event and its
  // script line.
  if (metrics.chart) {
    const x = metrics.chart.x + metrics.chart.width * 0.5;
    const y = metrics.chart.y + metrics.chart.height * 0.6;
    await page("Input.dispatchMouseEvent", { type: "mouseMoved", x, y });
    await new Promise((r) => setTimeout(r, 100));
  }
  const tooltip = await evaluate(`(() => { const t = document.querySelector(".chart-wrap .tip"); return t && t.style.display === "block" ? t.textContent : ""; })()`);
  const { cssContentSize } = await page("Page.getLayoutMetrics");
  // The whole page, or its top $SCREENSHOT_HEIGHT pixels (what docs/report.png shows).
  const cap = Number(process.env.SCREENSHOT_HEIGHT) || 6000;
  const height = Math.ceil(Math.min(cssContentSize.height, cap));
  await page("Emulation.setDeviceMetricsOverride", { width: 1400, height, deviceScaleFactor: 1, mobile: false });
  await new Promise((r) => setTimeout(r, 100));
  const shot = await page("Page.captureScreenshot", { format: "png" });
  fs.writeFileSync(screenshotPath, Buffer.from(shot.data, "base64"));
  await page("Input.dispatchMouseEvent", { type: "mouseMoved", x: 2, y: 2 });
  // What each panel shows after its buttons (this moves the selection: after the screenshot).
  metrics.panels = await evaluate(`(() => {
    const click = (section, act) => { const b = section.querySelector("button[data-act='" + act + "']"); if (b && !b.disabled) { b.click(); return true; } return false; };
    const panels = [...document.querySelectorAll("section.panel")].map((section) => {
      const info = () => section.querySelector(".event-info").textContent;
      // Where the panel starts: on its first OOM if it has one, else its peak.
      const shown = { start: { info: info(), index: section.querySelector(".event-index").textContent, mapRects: section.querySelectorAll("svg.map rect").length, from: Number(section.dataset.zoomFrom), to: Number(section.dataset.zoomTo) } };
      if (click(section, "peak-allocated")) shown.peakAllocated = { info: info(), drawn: Number(section.dataset.drawnAllocatedPeak), from: Number(section.dataset.zoomFrom), to: Number(section.dataset.zoomTo) };
      if (click(section, "peak-reserved")) shown.peakReserved = { info: info(), drawn: Number(section.dataset.drawnReservedPeak), from: Number(section.dataset.zoomFrom), to: Number(section.dataset.zoomTo) };
      click(section, "all");
      shown.wholeRun = { allocated: Number(section.dataset.drawnAllocatedPeak), reserved: Number(section.dataset.drawnReservedPeak) };
      return {
        label: section.querySelector("h2").textContent,
        subtitle: section.querySelector(".panel-sub").textContent,
        counters: Object.fromEntries([...section.querySelectorAll("td[data-key]")].map((td) => [td.dataset.key, td.textContent])),
        markerLabels: [...section.querySelectorAll(".chart-wrap svg text")].map((t) => t.textContent),
        shown,
      };
    });
    return panels;
  })()`);
  clearTimeout(deadline);
  const network = requests.filter((url) => url !== reportUrl && !url.startsWith("data:"));
  finish(0, { requests: network, errors, messages, dialogs, loadMs, metrics, tooltip, screenshot: screenshotPath });
} catch (error) {
  console.error("check_report: " + (error.stack || error));
  finish(3);
}
