"""The what-if harness's driver: every run of plan.py, each a fresh `python3 run_one.py`
process, several at once, within a deadline; then one summary and the results packed under
$OUT for compare.py.

usage: cd tests/gpu/whatif && OUT=$OUT python3 run_all.py [--jobs 8] [--deadline 420]
           [--only REGEX] [--stage DIR] [--dry-run]

Order: the compile warm-up, the slow special recordings and every workload's base run
(phase 1: PyTorch's defaults, no fraction) start first; the runs under other configs follow;
a run under a tight fraction starts once its base run has ended, since its fraction is 1.1 x
that run's allocated peak / total memory. At most --jobs processes at once (fractions are per
process, so they do not interfere; the device is far larger than their sum).

Bounds: each run has its own timeout (plan.py); no run starts unless its expected time still
fits before --deadline seconds; at the deadline the runs still going are killed. Whatever
happens to a run (failure, timeout, crash, not started) is recorded in its meta file and in
the summary, and never stops the others.

Output (the only files written under $OUT, default ./whatif-out): whatif-results-K.tar
(K = 1..7, each under 15 MiB: part 1 holds every meta/stats JSON, the logs and the summary;
the snapshots are xz-compressed, NAME.pickle.xz) and summary.txt. Unpack them all into one
folder for compare.py.
"""
import argparse
import concurrent.futures
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from plan import build_plan, tight_fraction  # noqa: E402

PART_LIMIT = 15 << 20  # bytes per tar part (the lead brings back files of at most 16 MiB)
MAX_PARTS = 7  # plus summary.txt: 8 files at most come back
LOG_TAIL = 3000  # characters of a failed run's log kept in its meta


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=8, help="processes at once (at most 8)")
    p.add_argument("--deadline", type=float, default=420,
                   help="seconds after which no run is started and running ones are killed")
    p.add_argument("--only", default="", help="run only the runs whose name matches this regex "
                   "(and the runs they need)")
    p.add_argument("--stage", default="", help="working folder (default: a new one in /tmp)")
    p.add_argument("--python", default=sys.executable, help="the interpreter for run_one.py")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if not 1 <= args.jobs <= 8:
        p.error("--jobs must be between 1 and 8")
    return args


def select(runs, pattern):
    """The runs matching `pattern`, plus every run they need (transitively)."""
    if not pattern:
        return runs
    by_name = {r.name: r for r in runs}
    wanted = {r.name for r in runs if re.search(pattern, r.name)}
    frontier = list(wanted)
    while frontier:
        for need in by_name[frontier.pop()].needs:
            if need not in wanted:
                wanted.add(need)
                frontier.append(need)
    return [r for r in runs if r.name in wanted]


class Clock:
    """Seconds since the driver started, for progress lines."""

    def __init__(self):
        self.start = time.monotonic()

    def now(self):
        """Seconds elapsed."""
        return time.monotonic() - self.start

    def say(self, text):
        """One flushed progress line."""
        print(f"[{self.now():6.1f}s] {text}", flush=True)


def read_json(path):
    """The JSON at `path`, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(path, chars=LOG_TAIL):
    """The last `chars` characters of a text file ('' if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def size_text(n):
    """Bytes for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


class Driver:
    """Starts, watches and records the runs of one plan."""

    def __init__(self, runs, args, stage, clock):
        self.args = args
        self.stage = stage
        self.runs_dir = os.path.join(stage, "runs")
        self.logs_dir = os.path.join(stage, "logs")
        os.makedirs(self.runs_dir, exist_ok=True)
        os.makedirs(self.logs_dir, exist_ok=True)
        self.clock = clock
        self.order = {r.name: i for i, r in enumerate(runs)}
        self.pending = {r.name: r for r in runs}
        self.running = {}  # name -> (spec, Popen, started, log file)
        self.results = {}  # name -> meta dict
        self.env = self.child_env()

    def child_env(self):
        """The runs' environment: one compile cache for all (the warm-up fills it), few CPU
        threads each (8 processes share 16 cores), unbuffered output."""
        env = dict(os.environ)
        cache = os.path.join(self.stage, "cache")
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
        env.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
        env.setdefault("OMP_NUM_THREADS", "2")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def meta_path(self, name):
        """Where run `name` writes (or the driver writes for it) its meta JSON."""
        return os.path.join(self.runs_dir, name + ".meta.json")

    def record(self, spec, status, **fields):
        """Records a run the driver ended or never started, in the same meta format."""
        meta = read_json(self.meta_path(spec.name)) or {
            "name": spec.name, "workload": spec.workload, "role": spec.role,
            "base": spec.base, "config_label": spec.config_label, "conf": spec.conf,
            "completed": False, "caught_ooms": 0}
        meta["status"] = status
        meta.update(fields)
        with open(self.meta_path(spec.name), "w") as f:
            json.dump(meta, f, indent=1)
        self.results[spec.name] = meta
        return meta

    def fraction_for(self, spec):
        """The tight fraction of a run, from its base run's counters; raises ValueError with
        the reason when the base run gave none."""
        base_meta = self.results.get(spec.base) or {}
        stats = read_json(os.path.join(self.runs_dir, spec.base + ".stats.json"))
        if base_meta.get("status") != "completed" or not stats:
            raise ValueError(f"its base run {spec.base} ended '{base_meta.get('status')}' "
                             "with no counters to size a fraction from")
        return tight_fraction(stats, base_meta["total_memory"])

    def start(self, spec):
        """Starts run `spec` in its own process group (so a timeout kills its children too)."""
        fraction = None
        if spec.tight_fraction:
            try:
                fraction = self.fraction_for(spec)
            except (ValueError, KeyError) as why:
                self.record(spec, "skipped", skip_reason=str(why))
                self.clock.say(f"skip  {spec.name}: {why}")
                return
        log_path = os.path.join(self.logs_dir, spec.name + ".log")
        log = open(log_path, "w")
        argv = [self.args.python, os.path.join(HERE, "run_one.py")]
        argv += spec.argv(self.runs_dir, fraction)
        proc = subprocess.Popen(argv, cwd=HERE, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.running[spec.name] = (spec, proc, time.monotonic(), log)
        extra = f" fraction {fraction}" if fraction else ""
        self.clock.say(f"start {spec.name} [{spec.conf or 'defaults'}]{extra} "
                       f"({len(self.running)} running, {len(self.pending)} waiting)")

    def stop(self, name, status, reason):
        """Kills a running run's whole process group and records why."""
        spec, proc, started, log = self.running.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
        log_path = os.path.join(self.logs_dir, name + ".log")
        elapsed = round(time.monotonic() - started, 1)
        finished = read_json(self.meta_path(name))
        if finished and finished.get("stage") == "done":
            # It had written everything and hung on the way out (e.g. in a library's atexit):
            # its results stand.
            self.record(spec, finished["status"], killed_after_finishing=reason,
                        rc=proc.returncode, elapsed_s=elapsed)
            self.clock.say(f"done  {name}: {describe(finished)} (then hung: {reason})")
            return
        self.record(spec, status, stop_reason=reason, rc=proc.returncode, elapsed_s=elapsed,
                    log_tail=tail(log_path))
        self.clock.say(f"{status} {name}: {reason}")

    def reap(self):
        """Records every run that has ended; stops the ones past their timeout or the
        deadline."""
        for name, (spec, proc, started, log) in list(self.running.items()):
            rc = proc.poll()
            elapsed = time.monotonic() - started
            if rc is None:
                if elapsed > spec.timeout_s:
                    self.stop(name, "timeout", f"still running after {spec.timeout_s} s")
                elif self.clock.now() > self.args.deadline:
                    self.stop(name, "killed_at_deadline",
                              f"still running at the {self.args.deadline:.0f} s deadline")
                continue
            del self.running[name]
            log.close()
            log_path = os.path.join(self.logs_dir, name + ".log")
            meta = read_json(self.meta_path(name))
            if meta is None:
                meta = self.record(spec, "crashed", rc=rc, log_tail=tail(log_path))
            else:
                meta["rc"] = rc
                meta["elapsed_s"] = round(elapsed, 1)
                if meta.get("status") not in ("completed", "oom"):
                    meta["log_tail"] = tail(log_path)
                with open(self.meta_path(name), "w") as f:
                    json.dump(meta, f, indent=1)
                self.results[name] = meta
            self.clock.say(f"done  {name}: {describe(meta)}")

    def ready(self):
        """Pending runs whose needs have all ended, best first."""
        ready = [s for s in self.pending.values() if all(n in self.results for n in s.needs)]
        return sorted(ready, key=lambda s: (s.priority, self.order[s.name]))

    def run(self):
        """Runs the plan to the end or the deadline."""
        while self.pending or self.running:
            self.reap()
            for spec in self.ready():
                if len(self.running) >= self.args.jobs:
                    break
                del self.pending[spec.name]
                if self.clock.now() + spec.expected_s > self.args.deadline:
                    self.record(spec, "not_started",
                                stop_reason=f"would not end before the {self.args.deadline:.0f} s "
                                            f"deadline (expected {spec.expected_s} s)")
                    self.clock.say(f"not started {spec.name}: deadline")
                    continue
                self.start(spec)
            if self.pending and not self.running and not self.ready():
                for spec in list(self.pending.values()):
                    del self.pending[spec.name]
                    self.record(spec, "not_started", stop_reason="its needs never ended")
            time.sleep(0.25)

    def abort(self):
        """Kills everything still running (the driver itself is stopping)."""
        for name in list(self.running):
            self.stop(name, "killed_at_deadline", "the driver stopped")
        for spec in list(self.pending.values()):
            self.record(spec, "not_started", stop_reason="the driver stopped")
        self.pending.clear()


def describe(meta):
    """One line about how a run ended."""
    status = meta.get("status")
    parts = [str(status)]
    if meta.get("wall_s") is not None:
        parts.append(f"{meta['wall_s']:.1f} s")
    if meta.get("events") is not None:
        parts.append(f"{meta['events']} events")
    if meta.get("pickle_bytes"):
        parts.append(size_text(meta["pickle_bytes"]))
    if meta.get("caught_ooms"):
        parts.append(f"{meta['caught_ooms']} OOMs caught")
    if status == "oom":
        parts.append(f"uncaught OOM: {meta.get('uncaught_oom', '')[:120]}")
    if status in ("failed", "skipped", "crashed", "timeout", "not_started", "killed_at_deadline"):
        reason = (meta.get("error") or meta.get("skip_reason") or meta.get("stop_reason")
                  or (meta.get("log_tail") or "").strip().splitlines()[-1:] or [""])
        parts.append(str(reason if isinstance(reason, str) else reason[0])[:200])
    return ", ".join(parts)


def summary_text(results, plan_names, clock):
    """The summary printed at the end and packed with the results: one line per run, then
    the runs that did not complete and the tallies (last, so the tail of the output has
    them)."""
    lines = [f"what-if harness: {len(plan_names)} runs planned, {clock.now():.0f} s", ""]
    lines.append(f"{'run':<36} {'status':<12} {'wall s':>7} {'events':>7} {'pickle':>10} "
                 f"{'ooms':>5} {'fraction':>10}  config")
    for name in plan_names:
        m = results.get(name, {})
        ooms = m.get("oom_events", 0) or 0
        lines.append(f"{name:<36} {str(m.get('status', 'missing')):<12} "
                     f"{m.get('wall_s') or m.get('elapsed_s') or 0:>7.1f} "
                     f"{m.get('events', 0) or 0:>7} {size_text(m.get('pickle_bytes', 0) or 0):>10} "
                     f"{ooms:>5} {str(m.get('fraction') or '-'):>10}  {m.get('conf') or '(defaults)'}")
    problems = [(n, results[n]) for n in plan_names if n in results
                and results[n].get("status") not in ("completed", "oom")]
    if problems:
        lines.append("")
        lines.append("runs that did not complete:")
        for name, meta in problems:
            lines.append(f"  {name}: {describe(meta)}")
    lines.append("")
    big = [n for n in plan_names if (results.get(n, {}).get("events") or 0) > 100_000
           or (results.get(n, {}).get("pickle_bytes") or 0) > 8 << 20]
    if big:
        lines.append("over the size target (100k events or 8 MiB): " + ", ".join(big))
    torch_versions = {r.get("torch") for r in results.values() if r.get("torch")}
    if torch_versions:
        lines.append("torch: " + ", ".join(sorted(torch_versions)))
    counts = {}
    for name in plan_names:
        status = results.get(name, {}).get("status", "missing")
        counts[status] = counts.get(status, 0) + 1
    lines.append("status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines) + "\n"


def compress(path):
    """xz-compresses one file next to itself, removes the original; returns the new path."""
    with open(path, "rb") as src, lzma.open(path + ".xz", "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.remove(path)
    return path + ".xz"


def shorten(path, head=64 << 10, tail_bytes=192 << 10):
    """Keeps the start and the end of a long log (a chatty run must not crowd out the
    snapshots), with a line saying how much was cut."""
    size = os.path.getsize(path)
    if size <= head + tail_bytes:
        return
    with open(path, "rb") as f:
        first = f.read(head)
        f.seek(size - tail_bytes)
        last = f.read()
    with open(path, "wb") as f:
        f.write(first)
        f.write(f"\n[... {size - head - tail_bytes} bytes cut by run_all.py ...]\n".encode())
        f.write(last)


def pack(stage, out_dir, clock):
    """Packs the stage into at most MAX_PARTS tar files under out_dir; returns their paths.

    The snapshots are compressed one by one in parallel (xz); part 1 takes every small file
    first, then the snapshots are placed largest first into the part with the most room. A
    snapshot that fits no part is left out and named."""
    runs_dir = os.path.join(stage, "runs")
    pickles = [os.path.join(runs_dir, f) for f in sorted(os.listdir(runs_dir))
               if f.endswith(".pickle")]
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        compressed = list(pool.map(compress, pickles))
    for f in os.listdir(os.path.join(stage, "logs")):
        shorten(os.path.join(stage, "logs", f))
    small = []
    for folder in ("runs", "logs"):
        for f in sorted(os.listdir(os.path.join(stage, folder))):
            path = os.path.join(stage, folder, f)
            if not path.endswith(".xz") and not f.endswith(".tmp"):
                small.append(path)
    small += [os.path.join(stage, f) for f in ("summary.txt", "summary.json")
              if os.path.exists(os.path.join(stage, f))]
    parts = [[]]
    sizes = [sum(os.path.getsize(p) for p in small)]
    parts[0].extend(small)
    left_out = []
    for path in sorted(compressed, key=os.path.getsize, reverse=True):
        size = os.path.getsize(path)
        room = [i for i in range(len(parts)) if sizes[i] + size <= PART_LIMIT]
        if room:
            i = min(room, key=lambda j: sizes[j])
        elif len(parts) < MAX_PARTS and size <= PART_LIMIT:
            parts.append([])
            sizes.append(0)
            i = len(parts) - 1
        else:
            left_out.append((os.path.basename(path), size))
            continue
        parts[i].append(path)
        sizes[i] += size
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for i, members in enumerate(parts, 1):
        target = os.path.join(out_dir, f"whatif-results-{i}.tar")
        with tarfile.open(target, "w") as tar:
            for path in members:
                tar.add(path, arcname=os.path.relpath(path, stage))
        written.append(target)
    for name, size in left_out:
        clock.say(f"LEFT OUT (no room under {MAX_PARTS} x {size_text(PART_LIMIT)}): "
                  f"{name} ({size_text(size)})")
    return written, left_out


def main(argv=None):
    """Runs the plan, prints the summary, packs the results; exit 0 unless the driver itself
    failed (the runs' outcomes are in the summary, for compare.py to judge)."""
    args = parse_args(argv)
    runs = select(build_plan(), args.only)
    if args.dry_run:
        for r in sorted(runs, key=lambda r: r.priority):
            extra = " + tight fraction" if r.tight_fraction else (
                f" + limit {r.limit_bytes} B" if r.limit_bytes else "")
            print(f"p{r.priority} {r.name:<36} {r.workload:<16} [{r.conf or 'defaults'}]{extra}"
                  f" timeout {r.timeout_s}s needs {r.needs or '-'}")
        print(f"{len(runs)} runs")
        return 0
    out_dir = os.environ.get("OUT") or os.path.abspath("whatif-out")
    stage = args.stage or tempfile.mkdtemp(prefix="whatif-stage-")
    os.makedirs(stage, exist_ok=True)
    clock = Clock()
    clock.say(f"{len(runs)} runs, {args.jobs} at once, deadline {args.deadline:.0f} s; "
              f"stage {stage}; results to {out_dir}")
    driver = Driver(runs, args, stage, clock)
    try:
        driver.run()
    finally:
        driver.abort()
        names = [r.name for r in runs]
        text = summary_text(driver.results, names, clock)
        with open(os.path.join(stage, "summary.txt"), "w") as f:
            f.write(text)
        with open(os.path.join(stage, "summary.json"), "w") as f:
            json.dump({"runs": [driver.results.get(n, {"name": n, "status": "missing"})
                                for n in names]}, f, indent=1)
        print(text, flush=True)
        written, left_out = pack(stage, out_dir, clock)
        shutil.copy(os.path.join(stage, "summary.txt"), os.path.join(out_dir, "summary.txt"))
        total = 0
        for path in written + [os.path.join(out_dir, "summary.txt")]:
            size = os.path.getsize(path)
            total += size
            clock.say(f"wrote {path} ({size_text(size)})")
        clock.say(f"total under {out_dir}: {size_text(total)} in {len(written) + 1} files"
                  + (f"; {len(left_out)} snapshots left out" if left_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
