// Opens a gpumem HTML report in headless Chromium through the Chrome DevTools Protocol over
// --remote-debugging-pipe (no port, no npm package), and prints one JSON object: every
// request the page made
// other than loading its own file, console errors and uncaught exceptions, the sizes of the
// rendered timeline and segment map, the tooltip shown when hovering the timeline, and where
// the screenshot was written.
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
let loaded = false;
listeners.push((event) => {
  const p = event.params || {};
  switch (event.method) {
    case "Network.requestWillBeSent":
      requests.push(p.request.url);
      break;
    case "Runtime.consoleAPICalled":
      if (p.type === "error" || p.type === "assert") {
        errors.push("console." + p.type + ": " + (p.args || []).map((a) => a.value ?? a.description).join(" "));
      }
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
  await page("Page.navigate", { url: reportUrl });
  const evaluate = async (expression) =>
    (await page("Runtime.evaluate", { expression, returnByValue: true })).result.value;
  for (let i = 0; i < 200 && !(loaded && (await evaluate("document.body && document.body.dataset.ready")) === "1"); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const metrics = await evaluate(`(() => {
    const size = (el) => { if (!el) return null; const b = el.getBoundingClientRect(); return { width: b.width, height: b.height, x: b.x, y: b.y }; };
    const chart = document.querySelector("#chart-wrap svg");
    return {
      ready: document.body.dataset.ready || "",
      chart: size(chart),
      chartShapes: chart ? chart.querySelectorAll("polyline, path, polygon, line").length : 0,
      map: size(document.getElementById("map")),
      mapRects: document.querySelectorAll("#map rect").length,
      mapSegments: document.querySelectorAll("#map rect.outline").length,
      slider: Number(document.getElementById("slider").max),
      eventInfo: document.getElementById("event-info").textContent,
      summary: document.getElementById("summary").textContent.length,
    };
  })()`);
  // Hover the middle of the plot: the tooltip must name an event and its script line.
  if (metrics.chart) {
    const x = metrics.chart.x + metrics.chart.width * 0.5;
    const y = metrics.chart.y + metrics.chart.height * 0.5;
    await page("Input.dispatchMouseEvent", { type: "mouseMoved", x, y });
    await new Promise((r) => setTimeout(r, 100));
  }
  const tooltip = await evaluate(`(() => { const t = document.getElementById("tip"); return t.style.display === "block" ? t.textContent : ""; })()`);
  const { cssContentSize } = await page("Page.getLayoutMetrics");
  // The whole page, or its top $SCREENSHOT_HEIGHT pixels (what docs/report.png shows).
  const cap = Number(process.env.SCREENSHOT_HEIGHT) || 6000;
  const height = Math.ceil(Math.min(cssContentSize.height, cap));
  await page("Emulation.setDeviceMetricsOverride", { width: 1400, height, deviceScaleFactor: 1, mobile: false });
  await new Promise((r) => setTimeout(r, 100));
  const shot = await page("Page.captureScreenshot", { format: "png" });
  fs.writeFileSync(screenshotPath, Buffer.from(shot.data, "base64"));
  clearTimeout(deadline);
  const network = requests.filter((url) => url !== reportUrl && !url.startsWith("data:"));
  finish(0, { requests: network, errors, metrics, tooltip, screenshot: screenshotPath });
} catch (error) {
  console.error("check_report: " + (error.stack || error));
  finish(3);
}
