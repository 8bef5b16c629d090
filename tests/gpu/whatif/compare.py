"""Compares gpumem's replays with PyTorch's own runs from the what-if harness (issue 16,
acceptance 1-2; the held-back recordings of issue 17).

usage: python3 compare.py RESULTS --gpumem PATH [--jobs 2] [--json OUT.json] [--only REGEX]
                          [--bases OTHER_RESULTS]

RESULTS is the folder holding the whatif-results-*.tar files run_all.py wrote (they are
unpacked into RESULTS/unpacked, snapshots decompressed), or a folder that already has runs/.

Self-replay, for every recorded run: `gpumem replay RUN.pickle --alloc-conf
"CONF[,per_process_memory_fraction:F]" --device sim:TOTAL --json` must give every counter of
PyTorch's memory_stats() at the end (keys gpumem lacks are listed, not failed), reproduce
every recorded OOM and refuse no allocation PyTorch made, and pair every recorded segment
event (segment_events.differing 0). A snapshot recorded without history must be refused with
the fix named (_record_memory_history).

What-if, for every run made under another config C (and fraction F): the base run's snapshot
(PyTorch's defaults, no fraction) replayed under C and F must give that run's peaks
(reserved_bytes.all.peak, allocated_bytes.all.peak), num_device_alloc, num_device_free,
num_alloc_retries, num_ooms and whether it fits (PyTorch: no OOM at all). First the two runs'
request sequences are compared (sequences.py): a changed sequence is reported apart, not as a
failure. So is a changed timing: the same requests, but a free deferred by `record_stream`
completed later in the run than in the base run, or earlier where no synchronisation of the
allocator explains it (sequences.completed_otherwise). The allocator never delays a completion
and completes one early only when it synchronises, so the GPU's work took another time there,
and the replay, which completes deferred frees where the base
run did (and on its own OOM path), cannot know it; the replay's figures are shown beside. A run that met an OOM (ended by it, or caught it and went on: a batch halved, cuDNN falling
back to a smaller workspace) is compared on fits and on which allocation failed first, when
its requests up to the OOM are the base run's. A config PyTorch 2.11 refused must
be refused by gpumem too.

With --bases OTHER, every what-if run is paired with OTHER's base run of its workload instead
of its own (a base recording made in another process, whose segments the driver placed
around other memory): how much the answers hang on run-to-run differences of the recording.
Self-replay then covers the runs of RESULTS and OTHER's bases.

Exit status: 1 when any replay differs from PyTorch (a mismatch), 2 on bad arguments or no
results, else 0. Runs that failed on the GPU machine are listed, not counted as mismatches.
"""
import argparse
import concurrent.futures
import glob
import json
import lzma
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sequences import (allocs_before, completed_otherwise, first_difference,  # noqa: E402
                       first_oom_index, load_snapshot, request_sequence, trace_of)

PAIR_FIELDS = ["reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_device_alloc",
               "num_device_free", "num_alloc_retries", "num_ooms"]
RECORDED = ("completed", "oom")  # statuses whose snapshot and counters are PyTorch's end state


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="folder with whatif-results-*.tar, or with runs/")
    p.add_argument("--gpumem", required=True, help="the gpumem binary")
    p.add_argument("--jobs", type=int, default=2, help="replays at once")
    p.add_argument("--json", default="", help="also write every result to this JSON file")
    p.add_argument("--only", default="", help="compare only runs whose name matches this regex")
    p.add_argument("--timeout", type=float, default=600, help="seconds per replay")
    p.add_argument("--bases", default="",
                   help="pair the what-if runs with this other results folder's base runs")
    p.add_argument("--unpack-to", default="",
                   help="where to unpack the tars (default: RESULTS/unpacked, or a new folder "
                        "in /tmp when RESULTS is read-only)")
    return p.parse_args(argv)


# --- the results folder -----------------------------------------------------------------


def runs_folder(results, unpack_to=""):
    """The folder of run files: RESULTS/runs, or the tars in RESULTS unpacked into
    UNPACK_TO/runs; snapshots decompressed (NAME.pickle.xz -> NAME.pickle)."""
    tars = sorted(glob.glob(os.path.join(results, "whatif-results-*.tar")))
    if tars:
        root = unpack_to or (os.path.join(results, "unpacked") if os.access(results, os.W_OK)
                             else tempfile.mkdtemp(prefix="whatif-results-"))
        print(f"unpacking {len(tars)} tar files into {root}", file=sys.stderr)
        os.makedirs(root, exist_ok=True)
        for path in tars:
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    if not member.isfile() or member.name.startswith(("/", "..")) or \
                            ".." in member.name.split("/"):
                        raise SystemExit(f"compare.py: unexpected member {member.name!r} in {path}")
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(root, filter="data")
                else:
                    tar.extractall(root)
    else:
        root = results
    runs = os.path.join(root, "runs")
    if not os.path.isdir(runs):
        raise SystemExit(f"compare.py: no runs/ folder and no whatif-results-*.tar in {results}")
    for packed in glob.glob(os.path.join(runs, "*.pickle.xz")):
        plain = packed[:-3]
        if not os.path.exists(plain):
            if not os.access(runs, os.W_OK):
                raise SystemExit(f"compare.py: {runs} is read-only and holds compressed "
                                 "snapshots: give the folder of the tars instead")
            with lzma.open(packed) as src, open(plain + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(plain + ".tmp", plain)
    return runs


class Run:
    """One run's files: meta, PyTorch's final counters, the snapshot's path."""

    def __init__(self, folder, name):
        self.name = name
        self.meta = read_json(os.path.join(folder, name + ".meta.json")) or {}
        self.stats = read_json(os.path.join(folder, name + ".stats.json"))
        pickle_path = os.path.join(folder, name + ".pickle")
        self.pickle = pickle_path if os.path.exists(pickle_path) else None
        self._events = None

    @property
    def status(self):
        """How the run ended on the GPU machine."""
        return self.meta.get("status", "missing")

    @property
    def recorded(self):
        """Whether the run left PyTorch's end state: its snapshot and counters."""
        return self.status in RECORDED and self.pickle is not None and self.stats is not None

    def events(self):
        """The snapshot's trace (device 0), read once."""
        if self._events is None:
            self._events = trace_of(load_snapshot(self.pickle))
        return self._events

    def alloc_conf(self):
        """The run's config as gpumem's --alloc-conf: PyTorch's text plus the fraction."""
        parts = [self.meta.get("conf") or ""]
        if self.meta.get("fraction"):
            parts.append(f"per_process_memory_fraction:{self.meta['fraction']}")
        return ",".join(p for p in parts if p)

    def fits(self):
        """PyTorch's verdict: the job ran to its end with no OOM at all."""
        return self.status == "completed" and (self.stats or {}).get("num_ooms", 0) == 0

    def why_not_recorded(self):
        """Why a run has no end state to compare, in a few words."""
        reason = (self.meta.get("error") or self.meta.get("skip_reason")
                  or self.meta.get("stop_reason") or "")
        return f"{self.status}" + (f": {reason.splitlines()[0][:160]}" if reason else "")


def read_json(path):
    """The JSON at `path`, or None when missing."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_runs(folder, only=""):
    """Every run with a meta file, by name."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.meta.json"))):
        name = os.path.basename(path)[:-len(".meta.json")]
        if not only or re.search(only, name):
            runs[name] = Run(folder, name)
    return runs


# --- gpumem ------------------------------------------------------------------------------


class Replay:
    """One `gpumem replay --json`: its exit status, output and parsed report."""

    def __init__(self, rc, stdout, stderr):
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.report = None
        if rc == 0:
            try:
                self.report = json.loads(stdout)
            except ValueError:
                self.report = None

    def error(self):
        """gpumem's complaint, one line."""
        text = (self.stderr or self.stdout or "").strip().splitlines()
        return f"exit {self.rc}: " + (text[-1][:300] if text else "(no output)")


def replay(gpumem, pickle_path, alloc_conf, total, timeout, addresses_from=None):
    """Runs gpumem's replay of one snapshot under a config on a simulated device of `total`
    bytes, in a clean environment (no allocator variables that could leak into it); with
    `addresses_from`, its segments placed where that other recording's were
    (`--addresses-from`)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")}
    argv = [gpumem, "replay", pickle_path, "--alloc-conf", alloc_conf, "--device",
            f"sim:{total}", "--json"]
    if addresses_from:
        argv += ["--addresses-from", addresses_from]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Replay(124, "", f"gpumem replay did not end within {timeout} s")
    return Replay(done.returncode, done.stdout, done.stderr)


# --- self-replay ------------------------------------------------------------------------


def recorded_without_history(run):
    """Whether the run never called _record_memory_history (its meta says history None; a
    meta the driver wrote for a run that never ran has no history key at all)."""
    return "history" in run.meta and run.meta["history"] is None and run.meta.get("role") != "warmup"


def self_replay_verdict(run, result, missing_keys):
    """(verdict, details) of a run's self-replay: 'exact', 'exact in the window' (a trace that
    starts mid-run: every counter its window holds), 'MISMATCH' or 'refused as expected'; adds the counter keys gpumem does not report to `missing_keys`."""
    if recorded_without_history(run):
        text = (result.stdout or "") + (result.stderr or "")
        if result.rc != 0 and "_record_memory_history" in text:
            return "refused as expected", ["names the fix: _record_memory_history"]
        if result.rc != 0:
            return "MISMATCH", [f"refused without naming _record_memory_history: {result.error()}"]
        return "MISMATCH", ["an empty history replayed as a job (must be refused, naming "
                            "torch.cuda.memory._record_memory_history())"]
    if result.report is None:
        return "MISMATCH", [f"gpumem could not replay it: {result.error()}"]
    report = result.report
    problems = []
    final = report.get("final_stats", {})
    # A trace that starts mid-run (the history ring wrapped): gpumem says which counters only
    # its window holds. Totals over the window (`.allocated`, `.freed`, `num_*`) cannot equal
    # PyTorch's whole-run ones and are not compared; window peaks must not exceed PyTorch's
    # (its peak may lie before the window); current values must be equal.
    scope = {key: name for name, keys in (report.get("final_stats_scope") or {}).items()
             for key in keys}
    wrong = []
    window_totals = 0
    lower_peaks = []
    for key, value in sorted(run.stats.items()):
        if key not in final:
            missing_keys.add(key)
        elif scope.get(key) == "window_total":
            window_totals += 1
        elif scope.get(key) in ("window_peak", "estimated_window_peak") and final[key] < value:
            lower_peaks.append(f"{key} PyTorch {value} gpumem {final[key]}")
        elif final[key] != value:
            wrong.append(f"{key} PyTorch {value} gpumem {final[key]}")
    if wrong:
        problems.append(f"{len(wrong)} counters differ: " + "; ".join(wrong[:6])
                        + (" ..." if len(wrong) > 6 else ""))
    counts = report.get("counts", {})
    try:
        recorded_ooms = sum(1 for e in run.events() if e["action"] == "oom")
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError) as error:
        return "MISMATCH", [f"gpumem replayed a snapshot Python cannot read ({error})"]
    if counts.get("recorded_ooms") != recorded_ooms:
        problems.append(f"gpumem read {counts.get('recorded_ooms')} of the {recorded_ooms} "
                        "recorded OOMs")
    if counts.get("recorded_ooms_reproduced") != recorded_ooms:
        problems.append(f"{counts.get('recorded_ooms_reproduced')} of {recorded_ooms} recorded "
                        "OOMs reproduced")
    if counts.get("ooms"):
        problems.append(f"{counts['ooms']} allocations PyTorch made were refused (first at "
                        f"event {(report.get('first_oom') or {}).get('index')})")
    segments = report.get("segment_events", {})
    if segments.get("differing") != 0:
        first = segments.get("first_difference")
        problems.append(f"{segments.get('differing')} segment events differ "
                        f"(recorded {segments.get('recorded')}, replayed "
                        f"{segments.get('replayed')}; first: {json.dumps(first)})")
    details = [f"{counts.get('events')} events, {recorded_ooms} OOMs, "
               f"{segments.get('recorded')} segment events"]
    if scope:
        details.append(f"the trace starts mid-run: {window_totals} totals over the window not "
                       "compared" + (f"; peaks before the window: {'; '.join(lower_peaks)}"
                                     if lower_peaks else ""))
    if problems:
        return "MISMATCH", problems + details
    return ("exact in the window" if scope else "exact"), details


def describe_run(run):
    """A few words on what a run is, for its self-replay line."""
    words = []
    history = run.meta.get("history") or {}
    if recorded_without_history(run):
        words.append("no history")
    if history and history.get("context") is None:
        words.append("no frames")
    if history.get("stacks") == "all":
        words.append("C++ stacks")
    if history.get("skip_actions"):
        words.append("skip " + ",".join(history["skip_actions"]))
    events = run.meta.get("events") or 0
    if history.get("max_entries") and events >= history["max_entries"]:
        words.append(f"ring wrapped at {history['max_entries']}")
    if run.meta.get("fraction"):
        words.append(f"fraction {run.meta['fraction']}")
    if run.status == "oom":
        words.append("ended by an OOM")
    if run.meta.get("caught_ooms"):
        words.append(f"{run.meta['caught_ooms']} OOMs caught")
    if len(run.meta.get("streams") or []) > 1:
        words.append(f"{len(run.meta['streams'])} streams")
    pools = [p for p in run.meta.get("segment_pool_ids") or [] if list(p) != [0, 0]]
    if pools:
        words.append(f"{len(pools)} private pools")
    return ", ".join(words)


# --- what-if pairs ----------------------------------------------------------------------


def timing_words(block, base_at, run_at):
    """A deferred free that completed elsewhere in the run than in the base run, in words."""
    return (f"the deferred free of allocation {block} completed after request {run_at}, in the "
            f"base run after {base_at}, where no synchronisation of the allocator explains it: "
            "the GPU's timing differed")


def pair_plan(run, base):
    """How a what-if pair can be compared: ('full' | 'prefix' | 'timing' | 'prefix timing' |
    'changed' | 'none', words).

    full: the same request sequence; prefix: the run met an OOM after making the base run's
    first requests (and asked then for the base run's next allocation), whether it ended
    there or caught it and went on otherwise (a batch halved); timing
    and prefix timing: either, but a deferred free completed elsewhere for a reason only the
    GPU's timing gives (compared, shown apart, not judged)."""
    if base is None or not base.recorded or base.status != "completed":
        return "none", f"no base run to replay ({base.why_not_recorded() if base else 'missing'})"
    if not run.recorded:
        return "none", f"no run ({run.why_not_recorded()})"
    ours = request_sequence(run.events())
    theirs = request_sequence(base.events())
    difference = first_difference(theirs, ours)
    if difference is None:
        moved = completed_otherwise(base.events(), run.events(), run.stats or {})
        if moved is not None:
            return "timing", "same requests, but " + timing_words(*moved)
        return "full", "same request sequence"
    oom_at = first_oom_index(run.events())
    if oom_at is not None:
        before = request_sequence(run.events(), stop_at=oom_at)
        if theirs[:len(before)] == before:
            # An `oom` event records the rounded request (PyTorch's params.size()): 512-byte
            # rounding, or roundup_power2_divisions' coarser one, never up to twice the size.
            failed = run.events()[oom_at]["size"]
            following = theirs[len(before):len(before) + 1]
            if following and following[0][0] == "alloc" and \
                    following[0][1] <= failed < 2 * following[0][1] + 512:
                # Its OOM path completed every pending free before the `oom` event.
                moved = completed_otherwise(base.events(), run.events()[:oom_at + 1],
                                            run.stats or {})
                if moved is not None:
                    return "prefix timing", timing_words(*moved) + " before its OOM"
                return "prefix", (f"the run's {len(before)} requests before its OOM are the "
                                  "base run's")
    position, base_entry, run_entry = difference
    return "changed", (f"request {position}: base {base_entry}, run {run_entry} "
                       f"({len(theirs)} vs {len(ours)} requests)")


def pair_verdict(run, base, kind, result):
    """(verdict, fields) of a comparable what-if pair: 'exact' or 'differs'.
    fields: [(name, PyTorch's value, gpumem's value)] of every field compared."""
    if result.report is None:
        return "differs", [("replay", "runs", result.error())]
    report = result.report
    final = report.get("final_stats", {})
    fields = [("fits", run.fits(), report.get("fits"))]
    if kind == "full":
        fields += [(key, run.stats.get(key), final.get(key)) for key in PAIR_FIELDS]
    else:
        oom_at = first_oom_index(run.events())
        ours = allocs_before(run.events(), oom_at)
        first = report.get("first_oom")
        # gpumem numbers events from 1 (event N is trace[N - 1]).
        theirs = allocs_before(base.events(), first["index"] - 1) if first else None
        fields.append(("first OOM at allocation #", ours, theirs))
    verdict = "exact" if all(a == b for _, a, b in fields) else "differs"
    return verdict, fields


# --- the comparison ---------------------------------------------------------------------

# The pair kinds that are replayed, and how each is compared (pair_verdict's kind).
COMPARED = {"full": "full", "prefix": "prefix", "timing": "full", "prefix timing": "prefix"}


def compare(runs, gpumem, jobs, timeout):
    """Runs every replay and judges it; returns (self-replay rows, pair rows, missing keys)."""
    missing_keys = set()
    self_rows = []
    pair_rows = []
    tasks = {}
    diagnoses = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for run in runs.values():
            if run.meta.get("role") == "warmup":
                continue
            if run.recorded:
                total = run.meta.get("total_memory")
                tasks[("self", run.name)] = pool.submit(
                    replay, gpumem, run.pickle, run.alloc_conf(), total, timeout)
            if run.meta.get("role") == "whatif":
                base = runs.get(run.meta.get("base"))
                try:
                    kind, why = pair_plan(run, base)
                except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError) as error:
                    kind, why = "none", f"a snapshot could not be read: {error}"
                if kind in COMPARED:
                    tasks[("pair", run.name)] = pool.submit(
                        replay, gpumem, base.pickle, run.alloc_conf(),
                        run.meta.get("total_memory"), timeout)
                elif kind == "none" and run.meta.get("config_refused") and base and base.recorded:
                    tasks[("refused", run.name)] = pool.submit(
                        replay, gpumem, base.pickle, run.alloc_conf(),
                        base.meta.get("total_memory"), timeout)
                pair_rows.append({"run": run.name, "base": run.meta.get("base"),
                                  "config": run.alloc_conf() or "(defaults)", "kind": kind,
                                  "why": why})
        for run in runs.values():
            if run.meta.get("role") == "warmup":
                continue
            row = {"run": run.name, "config": run.alloc_conf() or "(defaults)",
                   "what": describe_run(run)}
            if ("self", run.name) in tasks:
                result = tasks[("self", run.name)].result()
                row["verdict"], row["details"] = self_replay_verdict(run, result, missing_keys)
            else:
                row["verdict"], row["details"] = "not run", [run.why_not_recorded()]
            self_rows.append(row)
        for row in pair_rows:
            run = runs[row["run"]]
            if row["kind"] in COMPARED:
                result = tasks[("pair", run.name)].result()
                kind = COMPARED[row["kind"]]
                row["verdict"], fields = pair_verdict(run, runs[row["base"]], kind, result)
                row["fields"] = [list(f) for f in fields]
                # gpumem's own warning that its answer depends on where the driver places
                # segments (a second replay with the simulator's placement disagreed).
                row["borderline"] = bool(((result.report or {}).get("verdict") or {})
                                         .get("borderline"))
                if row["verdict"] == "differs" and row["kind"] in ("full", "prefix"):
                    diagnoses[row["run"]] = pool.submit(
                        replay, gpumem, runs[row["base"]].pickle, run.alloc_conf(),
                        run.meta.get("total_memory"), timeout, run.pickle)
                if row["kind"] in ("timing", "prefix timing"):
                    # Shown, not judged: the replay follows the base run's completions.
                    row["verdict"] = ("changed timing" if row["verdict"] == "differs"
                                      else "changed timing, equal")
            elif row["kind"] == "changed":
                row["verdict"] = "changed sequence"
            elif ("refused", run.name) in tasks:
                result = tasks[("refused", run.name)].result()
                if result.rc == 2:
                    row["verdict"] = "both refuse the config"
                else:
                    row["verdict"] = "differs"
                    row["why"] = (f"PyTorch 2.11 refused the config ({run.meta.get('error', '')[:160]}) "
                                  f"but gpumem replayed under it")
            else:
                row["verdict"] = "no comparison"
        for row in pair_rows:
            if row["run"] in diagnoses:
                run = runs[row["run"]]
                row["at_run_addresses"] = placement_diagnosis(
                    run, runs[row["base"]], COMPARED[row["kind"]],
                    diagnoses[row["run"]].result())
    return self_rows, pair_rows, missing_keys


def placement_diagnosis(run, base, kind, result):
    """What a differing pair's replay gives with its segments at the run's own addresses
    (`gpumem replay --addresses-from RUN`): {'verdict': 'exact' | 'differs', 'fields',
    'placed'}. The driver does not place the same calls alike in two processes (memory no
    trace shows differs between them), and PyTorch breaks best-fit ties by address, so a
    pair can differ by placement alone. Exact there, with every segment at the run's
    addresses, the allocator's decisions were PyTorch's, and the difference is placement a
    base run's file cannot carry to another process; differing there too, they were not.
    Shown beside the verdict, never instead of it."""
    verdict, fields = pair_verdict(run, base, kind, result)
    placed = (result.report or {}).get("placed") or {}
    # Every segment the run made was placed at its address (a run ended by its OOM made none
    # after it, where the replay goes on).
    made = sum(event["action"] == "segment_alloc" for event in run.events())
    followed = placed.get("sequence", 0) == made
    return {"verdict": verdict if followed or verdict == "differs" else "exact, partly placed",
            "fields": [list(f) for f in fields], "placed": placed}


MISMATCHES = ("MISMATCH", "differs")


def render(self_rows, pair_rows, missing_keys):
    """The report as text."""
    out = ["Self-replay (each run's snapshot under its own config and fraction):"]
    for row in self_rows:
        what = f" [{row['what']}]" if row["what"] else ""
        out.append(f"  {row['verdict']:<20} {row['run']:<34}{what}")
        for line in row["details"]:
            out.append(f"      {line}")
    out.append("")
    out.append("What-if pairs (the base run's snapshot replayed under the run's config, "
               "against the run):")
    out.append(f"  {'run':<34} {'verdict':<24} details")
    for row in pair_rows:
        if row.get("fields") and row["verdict"] == "exact":
            detail = ", ".join(name for name, _, _ in row["fields"])
            detail = f"equal: {detail}" + (" (prefix up to the run's OOM)"
                                           if row["kind"] == "prefix" else "")
        elif row.get("fields"):
            detail = "; ".join(f"{name} PyTorch {a} gpumem {b}"
                               for name, a, b in row["fields"] if a != b)
            if row["kind"] in ("timing", "prefix timing"):
                detail = row["why"] + (f" ({detail})" if detail else "")
        else:
            detail = row["why"]
        if row.get("borderline"):
            detail += (" [gpumem: borderline, the answer depends on the placement or the"
                       " GPU's timing]")
        diagnosis = row.get("at_run_addresses")
        if diagnosis:
            words = diagnosis["verdict"]
            if diagnosis["verdict"] != "exact":
                words += ": " + "; ".join(f"{name} PyTorch {a} gpumem {b}"
                                          for name, a, b in diagnosis["fields"] if a != b)
            detail += f" [at the run's own segment addresses: {words}]"
        out.append(f"  {row['run']:<34} {row['verdict']:<24} {detail}")
    out.append("")
    if missing_keys:
        out.append("memory_stats() keys gpumem does not report: " + ", ".join(sorted(missing_keys)))
    else:
        out.append("memory_stats() keys gpumem does not report: none")
    tally = {}
    for row in self_rows:
        tally.setdefault("self-replay", {}).setdefault(row["verdict"], 0)
        tally["self-replay"][row["verdict"]] += 1
    for row in pair_rows:
        tally.setdefault("what-if", {}).setdefault(row["verdict"], 0)
        tally["what-if"][row["verdict"]] += 1
    for what, counts in tally.items():
        out.append(f"{what}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    fit = fit_tally(pair_rows)
    if fit["pairs"]:
        out.append(f"fit verdict: {fit['agree']} of {fit['pairs']} replayed pairs agree with PyTorch; "
                   f"gpumem says \"fits\" where PyTorch ran out of memory: {fit['false_fits']}, "
                   f"\"does not fit\" where PyTorch fit: {fit['false_alarms']}")
    diagnosed = [row for row in pair_rows
                 if row["verdict"] == "differs" and row.get("at_run_addresses")]
    if diagnosed:
        exact = sum(row["at_run_addresses"]["verdict"] == "exact" for row in diagnosed)
        out.append(f"differing pairs replayed again at the run's own segment addresses: {exact} "
                   f"of {len(diagnosed)} exact (the allocator decided as PyTorch did; the driver "
                   f"placed segments elsewhere in the two processes), "
                   f"{len(diagnosed) - exact} not")
    flagged = [row for row in pair_rows if row.get("borderline")]
    if flagged:
        out.append(f"borderline (gpumem says its answer depends on the placement or the GPU's "
                   f"timing): {len(flagged)}, "
                   f"{sum(row['verdict'] == 'differs' for row in flagged)} of them differing")
    return "\n".join(out) + "\n"


def fit_tally(pair_rows):
    """Over the replayed pairs (changed timing included): how many give PyTorch's answer to
    "does it fit?", and how many say it fits where PyTorch ran out of memory (what gpumem must
    never say) or the reverse."""
    verdicts = [fields[0][1:] for fields in (row.get("fields") or [] for row in pair_rows)
                if fields and fields[0][0] == "fits"]
    return {"pairs": len(verdicts),
            "agree": sum(theirs == ours for theirs, ours in verdicts),
            "false_fits": sum(ours is True and theirs is False for theirs, ours in verdicts),
            "false_alarms": sum(ours is False and theirs is True for theirs, ours in verdicts)}


def main(argv=None):
    """Compares, prints the report, returns the exit status (module docstring)."""
    args = parse_args(argv)
    if not os.path.exists(args.gpumem):
        print(f"compare.py: no gpumem binary at {args.gpumem} (cargo build first)", file=sys.stderr)
        return 2
    folder = runs_folder(args.results, args.unpack_to)
    runs = load_runs(folder, args.only)
    if not runs:
        print(f"compare.py: no run meta files in {folder}", file=sys.stderr)
        return 2
    if args.bases:
        # The other folder's tars go into a folder of their own, so that its base runs do
        # not overwrite these ones on disk.
        other_to = os.path.join(args.unpack_to, "bases") if args.unpack_to else ""
        others = load_runs(runs_folder(args.bases, other_to), args.only)
        bases = {run.meta.get("base") for run in runs.values()} - {None}
        for name in bases:
            if name in others:
                runs[name] = others[name]
            else:
                runs.pop(name, None)
    self_rows, pair_rows, missing_keys = compare(runs, args.gpumem, args.jobs, args.timeout)
    sys.stdout.write(render(self_rows, pair_rows, missing_keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"self_replay": self_rows, "pairs": pair_rows,
                       "missing_keys": sorted(missing_keys)}, f, indent=1, default=str)
    mismatched = [r for r in self_rows if r["verdict"] in MISMATCHES]
    mismatched += [r for r in pair_rows if r["verdict"] in MISMATCHES]
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
