"""Tests of the what-if harness that need neither a GPU nor torch: the plan, run_one's
arguments, the driver (scheduling, timeouts, failures, packing) with a stand-in for run_one,
the request sequences, and compare.py on real PyTorch snapshots (tests/replay/fixtures) with
gpumem's binary and with a stand-in whose answers are scripted.

usage: python3 -m unittest test_whatif        (from tests/gpu/whatif)
       GPUMEM=path/to/gpumem python3 -m unittest test_whatif
The tests that replay with the real binary use $GPUMEM, else ../../../target/debug/gpumem, and
are skipped when neither exists.
"""
import contextlib
import io
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
import textwrap
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import plan  # noqa: E402
import retime  # noqa: E402
import ringcut  # noqa: E402
import run_all  # noqa: E402
import run_one  # noqa: E402
import sequences  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "replay", "fixtures"))
GPUMEM = os.environ.get("GPUMEM") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "target", "debug", "gpumem"))


RESULTS = os.path.join(HERE, "results")
# What-if pairs of results/ whose replay still differs from PyTorch's own run, each because the
# H200's driver placed a segment where the placement model (device/address_space.rs, run in the
# recording's addresses) cannot know to: pinned host memory the trace does not show
# (prefetch); in resnet's evaluation, a chunk of hidden memory with a 14 MiB hole, which the
# driver fills before the startup range (every resnet pair under a fraction that makes a new
# 14 MiB segment there: split64, and gc06 and combo, whose first OOM then comes at another
# request). The gc06 and combo pairs were exact under the model's former rule inside a chunk
# (the tail, then the lowest hole), which the driver does not follow (tests/gpu/placement:
# 98.6% of a bare driver's placements, against 100% for best fit).
KNOWN_WHATIF_DIFFERENCES = {"prefetch.split128.frac", "resnet.split64.frac", "resnet.gc06.frac",
                            "resnet.combo.frac"}


def event(action, size, stream=7, addr=0):
    """A trace event as PyTorch writes it (only the keys the harness reads)."""
    return {"action": action, "size": size, "stream": stream, "addr": addr, "frames": []}


class PlanTest(unittest.TestCase):
    """The plan covers what issue 16 asks, and its runs are well formed."""

    def test_every_whatif_workload_runs_under_six_configs_with_and_without_a_fraction(self):
        runs = plan.build_plan()
        for workload in plan.WHATIF_WORKLOADS:
            mine = [r for r in runs if r.workload == workload and r.role == "whatif"]
            plain = {r.config_label for r in mine if not r.tight_fraction}
            tight = {r.config_label for r in mine if r.tight_fraction}
            self.assertGreaterEqual(len(plain), 6, workload)
            self.assertGreaterEqual(len(tight), 6, workload)
            for r in mine:
                self.assertEqual(r.base, f"{workload}.base")
                if r.tight_fraction:
                    self.assertIn(r.base, r.needs)

    def test_needs_name_runs_of_the_plan(self):
        runs = plan.build_plan()
        names = {r.name for r in runs}
        for r in runs:
            self.assertTrue(set(r.needs) <= names, r.name)
            if r.base:
                self.assertIn(r.base, names)

    def test_argv_parses_in_run_one(self):
        for r in plan.build_plan():
            args = run_one.parse_args(r.argv("/tmp/x", fraction="0.0125" if r.tight_fraction else None))
            self.assertEqual(args.name, r.name)
            self.assertEqual(args.conf, r.conf)
            if r.tight_fraction:
                self.assertEqual(args.fraction, "0.0125")
            self.assertEqual(args.limit_bytes, r.limit_bytes or None)
            self.assertEqual(args.no_history, r.no_history)

    def test_run_one_refuses_a_fraction_and_a_limit_together(self):
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            run_one.parse_args(["--name", "a", "--workload", "unet", "--out", "/tmp",
                                "--fraction", "0.1", "--limit-bytes", "5"])

    def test_history_options(self):
        args = run_one.parse_args(["--name", "a", "--workload", "unet", "--out", "/tmp",
                                   "--context", "none", "--stacks", "all", "--max-entries", "9",
                                   "--skip-actions", "free_requested"])
        self.assertEqual(run_one.history_options(args),
                         {"enabled": "all", "context": None, "stacks": "all", "max_entries": 9,
                          "skip_actions": ["free_requested"]})
        args = run_one.parse_args(["--name", "a", "--workload", "unet", "--out", "/tmp",
                                   "--no-history"])
        self.assertIsNone(run_one.history_options(args))

    def test_config_errors_are_recognised(self):
        for text in ["RuntimeError: Unrecognized key 'foo' in Accelerator allocator config.",
                     "Unrecognized CachingAllocator option: foo",
                     "CachingAllocator option max_split_size_mb too small, must be >= 20"]:
            self.assertTrue(run_one.CONFIG_ERROR.search(text), text)
        self.assertFalse(run_one.CONFIG_ERROR.search("CUDA out of memory. Tried to allocate"))

    def test_tight_fraction(self):
        total = 150_109_880_320
        text = plan.tight_fraction({"allocated_bytes.all.peak": 1_000_000_000}, total)
        self.assertAlmostEqual(float(text), 1.1e9 / total, delta=1e-6 * 1.1e9 / total)
        self.assertEqual(text, format(float(text), ".6g"))
        with self.assertRaises(ValueError):
            plan.tight_fraction({"allocated_bytes.all.peak": 0}, total)

    def test_set_alloc_conf_clears_the_variable_that_would_win(self):
        saved = {k: os.environ.get(k) for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
        try:
            os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
            run_one.set_alloc_conf("max_split_size_mb:64")
            self.assertNotIn("PYTORCH_ALLOC_CONF", os.environ)
            self.assertEqual(os.environ["PYTORCH_CUDA_ALLOC_CONF"], "max_split_size_mb:64")
            run_one.set_alloc_conf("")
            self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


class SequenceTest(unittest.TestCase):
    """Request sequences: streams by first use, differences, OOM positions."""

    def test_streams_are_numbered_by_first_use(self):
        a = [event("alloc", 512, stream=99), event("segment_alloc", 2 << 20, stream=5),
             event("alloc", 1024, stream=5), event("free_requested", 512, stream=99),
             event("free_completed", 512, stream=99)]
        b = [dict(e, stream={99: 3, 5: 4}[e["stream"]]) for e in a]
        self.assertEqual(sequences.request_sequence(a),
                         [("alloc", 512, 0), ("alloc", 1024, 1), ("free_requested", 512, 0)])
        self.assertIsNone(sequences.first_difference(sequences.request_sequence(a),
                                                     sequences.request_sequence(b)))

    def test_first_difference(self):
        a = [("alloc", 1, 0), ("alloc", 2, 0)]
        self.assertEqual(sequences.first_difference(a, [("alloc", 1, 0), ("alloc", 3, 0)]),
                         (1, ("alloc", 2, 0), ("alloc", 3, 0)))
        self.assertEqual(sequences.first_difference(a, a[:1]), (1, ("alloc", 2, 0), None))

    def test_oom_position(self):
        events = [event("alloc", 1), event("alloc", 2), event("oom", 4096), event("alloc", 3)]
        self.assertEqual(sequences.first_oom_index(events), 2)
        self.assertEqual(sequences.allocs_before(events, 2), 2)
        self.assertEqual(sequences.request_sequence(events, stop_at=2),
                         [("alloc", 1, 0), ("alloc", 2, 0)])

    def test_a_deferred_free_completed_where_only_the_gpus_timing_explains_it(self):
        def job(completed_after):
            # Block 0 is freed on the side stream, its completion deferred; block 1 at once.
            events = [event("alloc", 512, addr=1), event("free_requested", 512, addr=1)]
            events += [event("alloc", 1024, addr=2 + n) for n in range(3)]
            events.insert(2 + completed_after, event("free_completed", 512, addr=1))
            return events + [event("free_requested", 1024, addr=2),
                             event("free_completed", 1024, addr=2)]
        base = job(2)
        self.assertEqual(sequences.deferred_completions(base), {0: (4, False)})
        self.assertEqual(sequences.deferred_completions(job(0)), {}, "completed at once")
        synced = {"num_sync_all_streams": 1, "num_alloc_retries": 0}
        never = {"num_sync_all_streams": 0, "num_alloc_retries": 0}
        retried = {"num_sync_all_streams": 1, "num_alloc_retries": 1}
        self.assertIsNone(sequences.completed_otherwise(base, base, synced))
        # Earlier in the run: a synchronisation could have done it (an empty_cache() that
        # released nothing shows nothing), unless the run never synchronised, or synchronised
        # only on OOM paths, whose retry makes a segment (or raises an OOM) right after.
        earlier = job(1)
        self.assertIsNone(sequences.completed_otherwise(base, earlier, synced))
        self.assertEqual(sequences.completed_otherwise(base, earlier, never), (0, 4, 3))
        self.assertEqual(sequences.completed_otherwise(base, earlier, retried), (0, 4, 3))
        on_the_oom_path = list(earlier)
        on_the_oom_path.insert(4, event("segment_alloc", 20 << 20, addr=99))
        self.assertEqual(sequences.deferred_completions(on_the_oom_path), {0: (3, True)})
        self.assertIsNone(sequences.completed_otherwise(base, on_the_oom_path, retried))
        # Later: only the GPU's timing delays a completion.
        self.assertEqual(sequences.completed_otherwise(base, job(3), synced), (0, 4, 5))
        # Deferred in the base run, done at the run's next malloc (right after its
        # free_requested): earlier, by the same rules.
        at_once = job(0)
        self.assertEqual(sequences.completed_otherwise(base, at_once, never), (0, 4, 2))
        self.assertEqual(sequences.completed_otherwise(base, at_once, retried), (0, 4, 2))
        self.assertIsNone(sequences.completed_otherwise(base, at_once, synced))
        self.assertEqual(sequences.completed_otherwise(at_once, base, never), (0, 2, 4))
        self.assertIsNone(sequences.completed_otherwise(at_once, at_once, never))

    def test_a_completion_the_run_made_on_its_oom_path_and_the_base_run_before_it(self):
        # Block 0's free is deferred; both runs complete it after the same request, the base
        # run with nothing after it (the GPU was done before the next malloc), the run right
        # before a segment event (its OOM path's synchronisation, then the retry's cudaMalloc).
        def job(then_segment):
            events = [event("alloc", 512, addr=1), event("free_requested", 512, addr=1),
                      event("alloc", 1024, addr=2), event("alloc", 1024, addr=3),
                      event("free_completed", 512, addr=1)]
            if then_segment:
                events.append(event("segment_alloc", 20 << 20, addr=99))
            return events + [event("alloc", 1024, addr=4)]
        base, on_the_oom_path = job(False), job(True)
        self.assertEqual(sequences.deferred_completions(base), {0: (4, False)})
        self.assertEqual(sequences.deferred_completions(on_the_oom_path), {0: (4, True)})
        retried = {"num_sync_all_streams": 1, "num_alloc_retries": 1}
        # A replay of the base run hands the block to the malloc the run made without it.
        self.assertEqual(sequences.completed_otherwise(base, on_the_oom_path, retried),
                         (0, 4, 4))
        # No retry in the run: its segment was no OOM path's.
        self.assertIsNone(sequences.completed_otherwise(
            base, on_the_oom_path, {"num_sync_all_streams": 0, "num_alloc_retries": 0}))
        # On both runs' OOM paths, or on neither: the same.
        self.assertIsNone(sequences.completed_otherwise(on_the_oom_path, on_the_oom_path,
                                                        retried))
        self.assertIsNone(sequences.completed_otherwise(base, base, retried))

    def test_earlier_completions_no_synchronisation_can_make_are_the_gpus_timing(self):
        # Blocks 0 and 1 (addresses 1 and 2) freed on a side stream, their completions deferred
        # (C1, C2); X are other requests.
        a1, f1 = event("alloc", 512, addr=1), event("free_requested", 512, addr=1)
        a2, f2 = event("alloc", 512, addr=2), event("free_requested", 512, addr=2)
        c1, c2 = event("free_completed", 512, addr=1), event("free_completed", 512, addr=2)
        x = [event("alloc", 1024, addr=10 + n) for n in range(4)]
        synced = {"num_sync_all_streams": 1, "num_alloc_retries": 0}
        # Both complete together in the base run; in the run block 0 completes earlier while
        # block 1 stays pending: a synchronisation completes every pending free, so this was the
        # allocator finding block 0's work done.
        base = [a1, f1, a2, f2, x[0], x[1], c1, c2, x[2], x[3]]
        self.assertIsNone(sequences.completed_otherwise(
            base, [a1, f1, a2, f2, x[0], c1, c2, x[1], x[2], x[3]], synced),
            "both earlier, together: one synchronisation could have done it")
        self.assertEqual(sequences.completed_otherwise(
            base, [a1, f1, a2, f2, x[0], c1, x[1], c2, x[2], x[3]], synced), (0, 6, 5))
        # Each completes earlier at a point of its own, leaving nothing pending: two points.
        base = [a1, f1, x[0], x[1], c1, a2, f2, x[2], x[3], c2]
        apart = [a1, f1, x[0], c1, x[1], a2, f2, x[2], c2, x[3]]
        self.assertEqual(sequences.completed_otherwise(base, apart, synced), (0, 4, 3))
        self.assertIsNone(sequences.completed_otherwise(
            base, apart, {"num_sync_all_streams": 2, "num_alloc_retries": 0}))
        # Two synchronisations, one an OOM path's (whose retry makes a segment or raises an
        # OOM right after): one empty_cache() for two points with nothing after them.
        self.assertEqual(sequences.completed_otherwise(
            base, apart, {"num_sync_all_streams": 2, "num_alloc_retries": 1}), (0, 4, 3))

    def test_a_run_ended_by_an_oom_is_checked_for_timing_up_to_it(self):
        def run(completed_after, oom_after=None):
            events = [event("alloc", 512, addr=1), event("free_requested", 512, addr=1)]
            events += [event("alloc", 1024, addr=2 + n) for n in range(3)]
            events.insert(2 + completed_after, event("free_completed", 512, addr=1))
            if oom_after is not None:
                events.insert(2 + oom_after, event("oom", 4096))
            return events
        retried = {"num_sync_all_streams": 1, "num_alloc_retries": 1}
        base = run(2)
        # The OOM path completes the pending free, then raises: not the GPU's timing.
        ended = run(1, oom_after=2)[:5]
        self.assertEqual(ended[-1]["action"], "oom")
        self.assertIsNone(sequences.completed_otherwise(base, ended, retried))
        # Completed at the first malloc before an OOM that comes later: the GPU's timing.
        early = run(0, oom_after=2)[:5]
        self.assertEqual(early[-1]["action"], "oom")
        self.assertEqual(sequences.completed_otherwise(base, early, retried), (0, 4, 2))

    def test_the_unpickler_builds_no_objects(self):
        with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
            pickle.dump({"segments": [], "x": unittest.TestCase}, f)
            f.flush()
            with self.assertRaises(pickle.UnpicklingError):
                sequences.load_snapshot(f.name)

    def test_fixture_pairs_have_the_same_sequence(self):
        for name in ("convnet", "transformer_fp32"):
            a = sequences.trace_of(sequences.load_snapshot(os.path.join(FIXTURES, f"{name}.default.pickle")))
            b = sequences.trace_of(sequences.load_snapshot(os.path.join(FIXTURES, f"{name}.expandable.pickle")))
            self.assertIsNone(sequences.first_difference(sequences.request_sequence(a),
                                                         sequences.request_sequence(b)))


try:
    import workloads
except ImportError:  # torch is not installed here
    workloads = None


@unittest.skipIf(workloads is None, "torch is not installed")
class SearchTest(unittest.TestCase):
    """The batch-size search of the bs_search workload."""

    def test_doubles_then_bisects_to_adjacent_bounds(self):
        found, trials = workloads.search_batch_size(lambda size: size <= 37, start=4, max_trials=12)
        self.assertEqual(found, 37)
        self.assertEqual(trials, [(4, True), (8, True), (16, True), (32, True), (64, False),
                                  (48, False), (40, False), (36, True), (38, False), (37, True)])

    def test_stops_after_max_trials_and_when_nothing_fits(self):
        self.assertEqual(workloads.search_batch_size(lambda size: True, 4, 3),
                         (16, [(4, True), (8, True), (16, True)]))
        self.assertEqual(workloads.search_batch_size(lambda size: False, 4, 12),
                         (0, [(4, False), (2, False), (1, False)]))


FAKE_RUN_ONE = textwrap.dedent('''\
    #!/usr/bin/env python3
    """Stands in for `python3 run_one.py ...` in the driver tests: behaves by run name."""
    import json, os, sys, time
    argv = sys.argv[2:]
    opt = lambda k: argv[argv.index(k) + 1] if k in argv else None
    name, out = opt("--name"), opt("--out")
    meta = {"name": name, "workload": opt("--workload"), "role": opt("--role"),
            "base": opt("--base") or "", "conf": opt("--conf"), "fraction": opt("--fraction"),
            "total_memory": 1000000, "completed": True, "status": "completed",
            "caught_ooms": 0, "events": 10, "wall_s": 0.1}
    if "hang" in name and "exit" not in name:
        time.sleep(60)
    if "crash" in name:
        sys.exit(9)
    if "fail" in name:
        meta.update(status="failed", completed=False, error="RuntimeError: boom")
        print("a traceback would be here")
    open(os.path.join(out, name + ".stats.json"), "w").write(
        json.dumps({"allocated_bytes.all.peak": 20000, "num_ooms": 0}))
    open(os.path.join(out, name + ".pickle"), "wb").write(b"x" * 5000)
    meta["pickle_bytes"] = 5000
    meta["stage"] = "done"
    json.dump(meta, open(os.path.join(out, name + ".meta.json"), "w"))
    if "hang_at_exit" in name:
        time.sleep(60)
    sys.exit(1 if meta["status"] == "failed" else 0)
    ''')


class DriverTest(unittest.TestCase):
    """run_all.py's scheduling, bounds and packing, with a stand-in for run_one.py."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="whatif-test-")
        self.fake = os.path.join(self.tmp, "fake_python")
        with open(self.fake, "w") as f:
            f.write(FAKE_RUN_ONE)
        os.chmod(self.fake, 0o755)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def drive(self, runs, deadline=60):
        """Runs `runs` through the driver; returns (driver, printed text)."""
        args = run_all.parse_args(["--python", self.fake, "--deadline", str(deadline), "--jobs", "3"])
        stage = os.path.join(self.tmp, "stage")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            driver = run_all.Driver(runs, args, stage, run_all.Clock())
            driver.run()
        return driver, printed.getvalue()

    def test_failures_timeouts_and_fractions(self):
        R = plan.RunSpec
        runs = [R("w.base", "unet", "base"),
                R("w.x.frac", "unet", "whatif", conf="c", base="w.base", tight_fraction=True,
                  needs=["w.base"]),
                R("v.fail", "unet", "base"),
                R("v.y.frac", "unet", "whatif", base="v.fail", tight_fraction=True,
                  needs=["v.fail"]),
                R("z.crash", "unet", "special"),
                R("z.hang", "unet", "special", timeout_s=2),
                R("late", "unet", "special", expected_s=10_000),
                R("z.hang_at_exit", "unet", "special", timeout_s=2)]
        driver, printed = self.drive(runs)
        status = {n: m["status"] for n, m in driver.results.items()}
        self.assertEqual(status, {"w.base": "completed", "w.x.frac": "completed",
                                  "v.fail": "failed", "v.y.frac": "skipped", "z.crash": "crashed",
                                  "z.hang": "timeout", "late": "not_started",
                                  "z.hang_at_exit": "completed"})
        self.assertIn("killed_after_finishing", driver.results["z.hang_at_exit"])
        self.assertEqual(driver.results["w.x.frac"]["fraction"], format(1.1 * 20000 / 1e6, ".6g"))
        self.assertIn("a traceback would be here", driver.results["v.fail"]["log_tail"])
        self.assertIn("start w.base", printed)
        text = run_all.summary_text(driver.results, [r.name for r in runs], run_all.Clock())
        self.assertIn("runs that did not complete:", text)
        self.assertIn("z.hang: timeout", text)

    def test_the_deadline_kills_running_runs(self):
        runs = [plan.RunSpec("a.hang", "unet", "special", timeout_s=60, expected_s=0)]
        driver, _ = self.drive(runs, deadline=1.5)
        self.assertEqual(driver.results["a.hang"]["status"], "killed_at_deadline")

    def test_pack_writes_parts_that_compare_unpacks(self):
        runs = [plan.RunSpec(f"r{i}", "unet", "special") for i in range(3)]
        driver, _ = self.drive(runs)
        out = os.path.join(self.tmp, "out")
        with contextlib.redirect_stdout(io.StringIO()):
            written, left_out = run_all.pack(driver.stage, out, run_all.Clock())
        self.assertEqual(left_out, [])
        self.assertTrue(all(os.path.getsize(p) <= run_all.PART_LIMIT for p in written))
        folder = compare.runs_folder(out)
        with open(os.path.join(folder, "r1.pickle"), "rb") as f:
            self.assertEqual(f.read(), b"x" * 5000)
        self.assertEqual(compare.read_json(os.path.join(folder, "r1.meta.json"))["status"], "completed")

    def test_the_whole_plan_with_a_stand_in(self):
        out = os.path.join(self.tmp, "out")
        printed = io.StringIO()
        saved = os.environ.get("OUT")
        os.environ["OUT"] = out
        try:
            with contextlib.redirect_stdout(printed):
                rc = run_all.main(["--python", self.fake, "--stage", os.path.join(self.tmp, "s")])
        finally:
            os.environ.pop("OUT")
            if saved is not None:
                os.environ["OUT"] = saved
        self.assertEqual(rc, 0)
        files = sorted(os.listdir(out))
        self.assertIn("summary.txt", files)
        self.assertLessEqual(len(files), 8)
        text = printed.getvalue()
        self.assertIn(f"status: completed {len(plan.build_plan())}", text)
        self.assertIn("total under", text)
        folder = compare.runs_folder(out, os.path.join(self.tmp, "unpacked"))
        metas = [f for f in os.listdir(folder) if f.endswith(".meta.json")]
        self.assertEqual(len(metas), len(plan.build_plan()))

    def test_select_keeps_what_a_run_needs(self):
        names = {r.name for r in run_all.select(plan.build_plan(), r"^compiled\.split64\.frac$")}
        self.assertEqual(names, {"compiled.split64.frac", "compiled.base", "compiled.warmup"})


def make_run(folder, name, fixture=None, snapshot=None, **meta):
    """Writes a run's files into `folder` from a fixture (its pickle and memory_stats) or an
    explicit snapshot dict."""
    stats = None
    if fixture:
        shutil.copy(os.path.join(FIXTURES, fixture + ".pickle"), os.path.join(folder, name + ".pickle"))
        with open(os.path.join(FIXTURES, fixture + ".json")) as f:
            recorded = json.load(f)
        stats = recorded["memory_stats"]
        meta.setdefault("total_memory", recorded["total_memory"])
    elif snapshot is not None:
        with open(os.path.join(folder, name + ".pickle"), "wb") as f:
            pickle.dump(snapshot, f)
        stats = {"allocated_bytes.all.peak": 0, "num_ooms": 0}
    if stats is not None:
        with open(os.path.join(folder, name + ".stats.json"), "w") as f:
            json.dump(meta.pop("stats", stats), f)
    full = {"name": name, "status": "completed", "completed": True, "conf": "", "fraction": None,
            "role": "special", "history": {"enabled": "all", "context": "alloc",
                                           "stacks": "python", "max_entries": 1000000}}
    full.update(meta)
    with open(os.path.join(folder, name + ".meta.json"), "w") as f:
        json.dump(full, f)


class CompareTest(unittest.TestCase):
    """compare.py's verdicts."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="whatif-compare-")
        self.runs = os.path.join(self.tmp, "runs")
        os.makedirs(self.runs)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_compare(self, gpumem):
        """compare.main on the folder; returns (exit status, printed report, JSON)."""
        printed = io.StringIO()
        out_json = os.path.join(self.tmp, "out.json")
        with contextlib.redirect_stdout(printed):
            rc = compare.main([self.tmp, "--gpumem", gpumem, "--json", out_json])
        with open(out_json) as f:
            return rc, printed.getvalue(), json.load(f)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_fixture_runs_with_the_real_binary(self):
        make_run(self.runs, "convnet.base", "convnet.default", role="base")
        make_run(self.runs, "convnet.expandable", "convnet.expandable", role="whatif",
                 base="convnet.base", conf="expandable_segments:True")
        make_run(self.runs, "convnet.changed", "transformer_fp32.default", role="whatif",
                 base="convnet.base")
        # A key PyTorch 2.11 does not know (large_segment_size_mb is one it knows).
        make_run(self.runs, "convnet.unknown_key", role="whatif", base="convnet.base",
                 conf="large_segment_size:64", status="failed", config_refused=True,
                 error="RuntimeError: Unrecognized key 'large_segment_size'")
        make_run(self.runs, "convnet.hung", role="whatif", base="convnet.base", status="timeout",
                 stop_reason="still running after 120 s")
        make_run(self.runs, "unet.no_history", snapshot={"segments": [], "device_traces": [[]]},
                 history=None, total_memory=150109880320)
        rc, text, result = self.run_compare(GPUMEM)
        pairs = {p["run"]: p for p in result["pairs"]}
        self.assertEqual(pairs["convnet.expandable"]["kind"], "full")
        self.assertEqual(pairs["convnet.expandable"]["verdict"], "exact", text)
        self.assertEqual(pairs["convnet.changed"]["verdict"], "changed sequence")
        self.assertEqual(pairs["convnet.unknown_key"]["verdict"], "both refuse the config")
        self.assertEqual(pairs["convnet.hung"]["verdict"], "no comparison")
        selfs = {r["run"]: r for r in result["self_replay"]}
        self.assertEqual(selfs["convnet.base"]["verdict"], "exact", text)
        self.assertEqual(selfs["convnet.hung"]["verdict"], "not run")
        # gpumem replays an empty history as a job that fits (issue 17): a mismatch today.
        self.assertIn(selfs["unet.no_history"]["verdict"], ("MISMATCH", "refused as expected"))
        self.assertEqual(rc, 1 if selfs["unet.no_history"]["verdict"] == "MISMATCH" else 0)
        self.assertIn("What-if pairs", text)

    def check_recordings(self, folder, min_exact, bases=None, known=None, not_run_ok=False,
                         unseen_sync=frozenset(), known_self=frozenset(), only=""):
        """The runs recorded on the H200 and kept in `folder`: each self-replay exact, and
        every what-if pair with the base run's request sequence exact but the few `known`
        (those above by default; a fix may shorten the list; a pair that starts to differ
        fails), at least `min_exact` of them. With `bases`, the what-if runs are paired with
        that folder's base recordings (compare.py --bases). `not_run_ok`: runs the driver did
        not start before its deadline are no failure. `unseen_sync`: runs whose self-replay may
        differ in `num_sync_all_streams` alone, by one (PyTorch's higher): a synchronisation
        that released and completed nothing, which no trace shows. `known_self`: runs whose
        self-replay is known to differ (each named with its cause where it is passed).
        `only`: compare only the runs whose name matches this regex (compare.py --only)."""
        known = KNOWN_WHATIF_DIFFERENCES if known is None else known
        allowed = ("exact", "exact in the window", "refused as expected") + (
            ("not run",) if not_run_ok else ())
        tars = [f for f in os.listdir(folder) if f.endswith(".tar")]
        if not tars:
            self.skipTest(f"no recordings in {folder}")
        printed = io.StringIO()
        name = os.path.relpath(folder, HERE).replace(os.sep, "-")
        out_json = os.path.join(self.tmp, f"{name}.json")
        with contextlib.redirect_stdout(printed):
            compare.main([folder, "--gpumem", GPUMEM, "--jobs", "2", "--json", out_json,
                          "--unpack-to", os.path.join(self.tmp, name)]
                         + (["--bases", bases] if bases else [])
                         + (["--only", only] if only else []))
        with open(out_json) as f:
            result = json.load(f)
        text = printed.getvalue()
        def sync_alone(r):
            match = re.fullmatch(r"1 counters differ: num_sync_all_streams PyTorch (\d+) gpumem (\d+)",
                                 r["details"][0] if r.get("details") else "")
            return bool(match) and int(match.group(1)) == int(match.group(2)) + 1

        wrong = [r["run"] for r in result["self_replay"]
                 if r["verdict"] not in allowed
                 and not (r["run"] in unseen_sync and sync_alone(r))]
        self.assertEqual(sorted(wrong), sorted(known_self), text)
        differing = {p["run"] for p in result["pairs"] if p["verdict"] == "differs"}
        self.assertLessEqual(differing, known, text)
        exact = {p["run"] for p in result["pairs"] if p["verdict"] == "exact"}
        self.assertGreaterEqual(len(exact), min_exact, text)
        # gpumem flags an answer that a second placement contradicts: only where it differs
        # from PyTorch's (an exact pair flagged would be a false alarm; a pair whose timing
        # changed may differ too), and every recording of
        # resnet.split64.frac where it differs, whose replay runs out of memory where PyTorch
        # fits.
        borderline = {p["run"] for p in result["pairs"] if p.get("borderline")}
        unequal = differing | {p["run"] for p in result["pairs"]
                               if p["verdict"] == "changed timing"}
        self.assertLessEqual(borderline, unequal, text)
        if "resnet.split64.frac" in differing:
            self.assertIn("resnet.split64.frac", borderline, text)
        # Every pair that differs differs by placement alone: replayed again with its segments
        # at the run's own addresses (`--addresses-from`), it gives PyTorch's answer, so the
        # allocator decided as PyTorch did and the two processes' drivers placed the same
        # calls differently ("partly placed": a pair compared up to the run's OOM holds the
        # run's addresses only while the replay's device calls are the run's). A pair that
        # differed there too would be gpumem's own error.
        for pair in result["pairs"]:
            if pair["verdict"] == "differs" and pair["kind"] in ("full", "prefix"):
                self.assertIn(pair["at_run_addresses"]["verdict"], ("exact", "exact, partly placed"),
                              f"{pair['run']}\n{text}")
        # Never "fits" where PyTorch ran out of memory; "does not fit" where it fit only for
        # the pair known to (borderline, above).
        fit = compare.fit_tally(result["pairs"])
        self.assertEqual(fit["false_fits"], 0, text)
        # "Does not fit" where PyTorch fit only as a borderline answer, which names what it
        # depends on (a placement, or the GPU's timing of side-stream work).
        false_alarms = {p["run"] for p in result["pairs"]
                        if (p.get("fields") or [[None]])[0] == ["fits", True, False]}
        self.assertEqual(fit["false_alarms"], len(false_alarms), text)
        self.assertLessEqual(false_alarms, borderline, text)
        self.assertIn("fit verdict: ", text)
        return exact

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_h200_recordings_in_results(self):
        """results/: the whole plan, recorded in five waves."""
        # 140 exact until 2026-12-05, when a free deferred in the base run and done at once in
        # the run (two_streams.default.frac, .split64.frac) read as the GPU's timing: "changed
        # timing, equal".
        self.check_recordings(RESULTS, 138)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_a_second_recording_of_every_run_under_a_fraction(self):
        """results-frac/: every `.frac` run and its base run, recorded again on 2026-12-04
        (run_all.py --only '\\.frac$'): replays of other base recordings of the same jobs."""
        self.check_recordings(os.path.join(HERE, "results-frac"), 66)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_runs_under_a_fraction_against_base_recordings_of_another_process(self):
        """results-frac/'s what-if runs paired with results/'s base recordings, made in other
        processes on another day: the same answers (measured on 2026-12-04: 64 exact, the
        same four differing, no false "fits"; 62 since the two two_streams pairs read as
        "changed timing, equal")."""
        self.check_recordings(os.path.join(HERE, "results-frac"), 62, bases=RESULTS)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_a_recording_with_every_kernel_module_loaded_at_start(self):
        """results-eager/: the plan under CUDA_MODULE_LOADING=EAGER (2026-12-05, 171 of the 201
        runs before the deadline). The three `resnet` pairs that differ in results/ are exact:
        their hidden 14 MiB hole was a kernel module loaded on first use."""
        # allocated_bytes.all.peak alone differs: the model's window, fitted to lazy loading,
        # is guessed wrong for an eager process (README.md). So is its judgement of two
        # segments that changed places (moe.pow2div4: docs/snapshots.md, step 1).
        # Since runs that met an OOM and went on are compared up to it (compare.py, "prefix"),
        # three unet pairs under the fraction differ in where the first OOM came (cuDNN's
        # workspace requests, which it catches), each exact at the run's own addresses. And
        # prefetch.gc06.frac, whose side-stream frees completed at other moments on the GPU,
        # ran out of memory where the base run's completions fit: gpumem's timing check reads
        # it as borderline, "may not fit" (timing_check.rs), so no pair says "fits" wrongly.
        known = {"transformer_ckpt.split64", "transformer_ckpt.split64.frac",
                 "resnet.lseg64", "unet.lseg64", "moe.pow2div4", "moe.pow2div4.frac",
                 "unet.combo.frac", "unet.gc06.frac", "unet.pow2div4.frac"}
        exact = self.check_recordings(os.path.join(HERE, "results-eager"), 107, known=known,
                                      not_run_ok=True)
        for pair in ("resnet.split64.frac", "resnet.gc06.frac", "resnet.combo.frac"):
            self.assertIn(pair, exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_workloads_written_after_the_placement_model_was_fitted(self):
        """results-wave3/: vit, offload and varlen under every config (2026-12-05), workloads
        the model never saw: every self-replay and every comparable pair exact (offload's
        pairs read as "changed timing": its side-stream frees complete when the GPU is done)."""
        exact = self.check_recordings(os.path.join(HERE, "results-wave3"), 30, known=set())
        for workload in ("vit", "varlen"):
            self.assertTrue(any(pair.startswith(workload + ".") for pair in exact), workload)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_repeated_recordings_of_the_pairs_that_differed(self):
        """repeats/repN/ (repeat.sh): the three pairs that differed, with their base runs, each
        recorded four times over. `lstm` under the combined config puts a 20 MiB segment in
        the startup range's free top every time, where the model once put it in a newer chunk
        opened for a 2 MiB segment: exact in every repetition."""
        for rep in sorted(os.listdir(os.path.join(HERE, "repeats"))):
            with self.subTest(rep=rep):
                exact = self.check_recordings(os.path.join(HERE, "repeats", rep), 1)
                self.assertIn("lstm.combo.frac", exact)
        # rep1's prefetch pair reads as "changed timing": two side-stream frees completed
        # after request 587 in both runs, before the next malloc in the base run and on the
        # run's OOM path. At rep1's run's own addresses, the base runs of rep2 to rep4 (the
        # same requests, their own timing) give that run's counters; rep1's does not.
        run = os.path.join(self.tmp, "repeats-rep1", "runs", "prefetch.split128.frac")
        with open(run + ".meta.json") as f:
            meta = json.load(f)
        with open(run + ".stats.json") as f:
            stats = json.load(f)
        conf = f"{meta['conf']},per_process_memory_fraction:{meta['fraction']}"
        for rep, reproduces in (("rep1", False), ("rep2", True), ("rep3", True), ("rep4", True)):
            base = os.path.join(self.tmp, f"repeats-{rep}", "runs", "prefetch.base.pickle")
            result = compare.replay(GPUMEM, base, conf, meta["total_memory"], 120,
                                    run + ".pickle")
            final = result.report["final_stats"]
            same = all(final[key] == stats[key] for key in compare.PAIR_FIELDS)
            self.assertEqual(same, reproduces, rep)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_fourth_wave_recorded_on_an_h100(self):
        """results-wave4/: graph_decode, buckets and chunked_ce under every config (2026-12-05, on
        the H100 80GB lent that day). Every `buckets` self-replay exact since the replay reads a
        completion right after its request, followed by more, as the OOM path's walk. The
        `graph_decode` runs ended by an OOM destroyed their MemPool before the snapshot (its
        emptyCache synchronised with nothing to release or complete): one synchronisation
        no trace shows. `chunked_ce.combo.frac` differs by one cudaFree (placement)."""
        destroyed_pool = {f"graph_decode.{c}.frac" for c in (
            "default", "expandable", "split64", "split128", "pow2div4", "gc06", "combo",
            "lseg64")}
        exact = self.check_recordings(os.path.join(HERE, "results-wave4"), 29,
                                      known={"chunked_ce.combo.frac"},
                                      unseen_sync=destroyed_pool)
        for workload in ("graph_decode", "chunked_ce"):
            self.assertTrue(any(pair.startswith(workload + ".") for pair in exact), workload)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_fourth_wave_recorded_on_the_h200(self):
        """results-wave4-h200/: the fourth wave again, on the H200 (2026-12-05), with
        `graph_decode` keeping its pools referenced from the start: its runs ended by an OOM
        keep their MemPool until the snapshot, so every self-replay is exact, with no
        synchronisation left unseen. `chunked_ce.combo.frac` differs by one cudaFree here too
        (the same placement tie as on the H100)."""
        exact = self.check_recordings(os.path.join(HERE, "results-wave4-h200"), 29,
                                      known={"chunked_ce.combo.frac"})
        for workload in ("graph_decode", "chunked_ce"):
            self.assertTrue(any(pair.startswith(workload + ".") for pair in exact), workload)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_fifth_wave_deletes_graphs_and_a_mempool_midway(self):
        """results-wave5/ (graph_evict on the H200, 2026-12-05): a CUDA graph deleted midway,
        its pool inferred from its capture, and a MemPool filled beside cached default blocks
        and destroyed midway, its pool inferred from the new segments its requests made
        (replay/captures.rs). Every self-replay exact (before the inferred pools: all 16
        differed). What-if: a replay under another config takes the MemPool a self-replay
        inferred; 3 `.frac` pairs differ by one allocation at their first OOM (placement,
        the README)."""
        known = {f"graph_evict.{c}.frac" for c in ("default", "split64", "split128")}
        exact = self.check_recordings(os.path.join(HERE, "results-wave5"), 12, known=known)
        self.assertTrue({"graph_evict.default", "graph_evict.split64",
                         "graph_evict.expandable", "graph_evict.gc06.frac"} <= exact, exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_sixth_wave_fills_a_mempool_in_phases(self):
        """results-wave6/ (pool_phases on an H100 80GB, 2026-12-05): evaluations in a MemPool
        emptied and filled again between training steps, then destroyed with no
        empty_cache() after it. Every what-if pair exact; before the replay took a
        self-replay's MemPool for a what-if, 4 `.frac` pairs said "fits" where PyTorch ran
        out of memory. `gc06.frac` and `combo.frac` exact since the replay tells the pool's
        malloc, whose garbage collection released cached segments, from an empty_cache()
        (replay/engine.rs, infer_collecting_mem_pool). `expandable.frac` and `split64.frac`
        differ by one synchronisation alone, made after the harness's OOM handler had ended
        and before it wrote the results, which no trace shows (recorded again in the
        handler: results-wave6-handler, exact)."""
        unseen = {f"pool_phases.{c}.frac" for c in ("expandable", "split64")}
        exact = self.check_recordings(os.path.join(HERE, "results-wave6"), 15, known=set(),
                                      unseen_sync=unseen)
        self.assertTrue({"pool_phases.combo.frac", "pool_phases.gc06.frac"} <= exact, exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_seventh_wave_keeps_features_in_one_mempool_and_scratch_in_others(self):
        """results-wave7/ (pool_cache on an H100 80GB, 2026-12-05), written after the replay
        learnt to infer MemPools and recorded before the fixes it led to: a long-lived
        feature MemPool and a new scratch MemPool every third step, all gone by the end.
        Before: 14 self-replays differed, 14 what-if pairs differed and 4 said "fits" where
        PyTorch ran out of memory. Now every what-if pair is exact, and every self-replay
        but 6 `.frac` ones, which differ by one synchronisation alone: they ran out of
        memory, and the synchronisation came after the harness's OOM handler had ended (see
        the sixth wave; results-wave7-handler, recorded in the handler, is exact)."""
        unseen = {f"pool_cache.{c}.frac" for c in ("default", "expandable", "lseg64",
                                                    "pow2div4", "split64", "split128")}
        exact = self.check_recordings(os.path.join(HERE, "results-wave7"), 15, known=set(),
                                      unseen_sync=unseen)
        self.assertTrue({"pool_cache.gc06.frac", "pool_cache.default",
                         "pool_cache.expandable"} <= exact, exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_fourth_sixth_and_seventh_waves_written_in_the_oom_handler(self):
        """results-wave4-handler/, -wave6-handler/, -wave7-handler/ (an H100 80GB, 2026-12-06):
        the waves whose OOM-ended self-replays differed by one unseen synchronisation,
        recorded again by the harness that writes an OOM-ended job's results in its handler,
        before the job's objects (its MemPools among them) die (run_one.py). Every
        self-replay is exact, with no synchronisation allowed to differ; the what-if pairs
        hold as in the first recordings (`chunked_ce.combo.frac` is the same placement tie)."""
        cases = (("results-wave4-handler", 29, {"chunked_ce.combo.frac"}),
                 ("results-wave6-handler", 15, set()),
                 ("results-wave7-handler", 15, set()))
        for folder, min_exact, known in cases:
            with self.subTest(folder=folder):
                self.check_recordings(os.path.join(HERE, folder), min_exact, known=known)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_eighth_wave_searches_a_batch_size_inside_a_mempool(self):
        """results-wave8/ (pool_retry on an H100 80GB, 2026-12-05), recorded after the seventh
        wave's fixes and not fitted to: a batch-size search inside a MemPool, its OOMs caught.
        Before the release-run fix (a pool's segments told by its release, made before the
        first one the replay knew): 14 self-replays and 9 what-if pairs differed, 2 saying
        "fits" where PyTorch ran out of memory. Then 5 self-replays differed; since the fixes
        of the session after (an OOM whose default-pool reading would have released segments,
        a pool's own release_available_cached_blocks, garbage collection that passed over a
        pool's segments, an expandable pool's pages mapped beside its own) every self-replay is
        exact, and every what-if pair whose request sequence matches (6 changed their sequence:
        the caught OOMs)."""
        exact = self.check_recordings(os.path.join(HERE, "results-wave8"), 9, known=set())
        self.assertIn("pool_retry.default", exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_ninth_wave_feeds_mempools_from_a_side_stream(self):
        """results-wave9/ (pool_side on the H200, 2026-12-06), recorded after the eighth
        wave's fixes and the mem_pool_swaps property, not fitted to: prefetch MemPools fed
        from a side stream with record_stream, each destroyed while its last batch's free is
        still deferred, then a batch search in an eval MemPool kept to the end. As recorded,
        15 self-replays and 5 what-if pairs differed; with the rules seed 25 of mem_pool_swaps
        found (docs/snapshots.md) 9 and 3, and no pair says "fits" where PyTorch ran out of
        memory; with the self-replay under a memory fraction the file does not record read as
        the recorded run wherever learning so reproduced it (2026-12-06, second session), 4
        self-replays; with a destroyed pool's unmaps told from a whole empty_cache() (the
        pool's expandable segment held in the default pools, 2026-12-06, third session), 2.
        The what-if pairs of `split64`, `split128` and `pow2div4` made and freed 11 segments
        more than PyTorch until the self-replay learnt the three prefetch pools apart (a
        release before a pool's request that made none is another pool's; a pool's release
        walks its default-held segments too): now every what-if pair is exact or changed.
        `gc06.frac` and `combo.frac` differed in 45 counters and 89 segment events (garbage
        collection passed over the first pool's segments, which nothing names before their
        release); with that collection's segments claimed for an unnamed pool and the last
        pool's small segment told by its release, every segment event is PyTorch's and 2
        counters differed: the uncaught OOM's retry and synchronisation (read as asked in a
        pool, whose OOM path skips `release_cached_blocks`). That reading was made while the
        default pools held the last pool's small segment, which the pool's release claimed
        later: with such readings no longer trusted (2026-12-06, fourth session), every
        self-replay is exact (their what-if pairs were exact before). A run that starts to
        differ fails."""
        exact = self.check_recordings(os.path.join(HERE, "results-wave9"), 5, known=set())
        self.assertTrue({"pool_side.split64", "pool_side.split128", "pool_side.pow2div4",
                         "pool_side.gc06.frac", "pool_side.combo.frac"} <= exact, exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_tenth_wave_serves_on_three_streams_and_fine_tunes(self):
        """results-wave10/ (pipeline and finetune on an H100 80GB, 2026-12-06), recorded after
        the ninth wave's fixes and not fitted to: the default pools under a serving process's
        three streams (record_stream both ways, a model swapped midway, empty_cache() every 20
        requests) and a fine-tuning script's habits (accumulation, clipping, evaluation then
        empty_cache(), a checkpoint cloned on the device). Every self-replay is exact as
        recorded. The pipeline pairs under another config completed deferred frees elsewhere
        than the base run where no synchronisation of the allocator can have (one left another
        pending, or more points than the run synchronised): the GPU's timing, reported apart.
        The four finetune pairs that differed (split64, split64.frac, gc06.frac, combo.frac)
        differed by placement, and are exact since the replay's address space learns a chunk
        the driver kept after its segment went (device/address_space.rs, kept_chunk_at).
        A replay with the simulator's placement finishes (it refused gc06.frac and
        combo.frac, entering a made-up pool it had let go)."""
        folder = os.path.join(HERE, "results-wave10")
        exact = self.check_recordings(folder, 15, known=set())
        self.assertTrue({"finetune.split64", "finetune.split64.frac", "finetune.gc06.frac",
                         "finetune.combo.frac"} <= exact, exact)
        self.assertIn("finetune.default", exact)
        runs = os.path.join(self.tmp, "results-wave10", "runs")
        done = subprocess.run(
            [GPUMEM, "replay", os.path.join(runs, "finetune.gc06.frac.pickle"), "--alloc-conf",
             "garbage_collection_threshold:0.6,per_process_memory_fraction:0.01806",
             "--device", "sim:79.18GiB", "--placement", "model"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("verdict", done.stdout)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_eleventh_wave_resumes_from_a_checkpoint_and_cuts_video_clips(self):
        """results-wave11/ (resume and frames on an H100 80GB, 2026-12-07), written before it
        was recorded and not fitted to, under four configs no earlier wave ran
        (max_non_split_rounding_mb, expandable segments with max_split_size_mb or a gc
        threshold, roundup_power2_divisions:8): a run resumed from a checkpoint loaded onto
        the device then served in float16, and video clips of a new size every step with
        buffers beyond any max_split_size_mb, halving its batch on OOM under the fraction.
        Every self-replay is exact as recorded (frames.nonsplit256.frac ended by an uncaught
        OOM, reproduced). The halving pairs changed their request sequence; of the others one
        differs (resume.gc06.frac, num_device_free 64 against 63) and is exact at the run's
        own segment addresses: the driver placed a segment elsewhere in the two processes."""
        folder = os.path.join(HERE, "results-wave11")
        exact = self.check_recordings(folder, 35, known={"resume.gc06.frac"})
        self.assertIn("frames.nonsplit256.frac", exact)
        with open(os.path.join(self.tmp, "results-wave11.json")) as f:
            pairs = json.load(f)["pairs"]
        for pair in pairs:
            if pair["verdict"] == "differs":
                self.assertEqual(pair["at_run_addresses"]["verdict"], "exact", pair)
            for field, pytorch, ours in pair.get("fields", []):
                if field == "fits":
                    self.assertEqual(pytorch, ours, pair)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_twelfth_wave_searches_beams_and_samples_a_diffusion_model(self):
        """results-wave12/ (beam and diffusion on an H100 80GB, 2026-12-07), written before it
        was recorded and not fitted to, under four more configs no earlier wave ran
        (expandable segments with rounding divisions, max_split_size_mb:32 with a 0.9
        collection threshold, large_segment_size_mb:32 with max_split_size_mb:256, 2
        divisions): beam search re-ordering its KV cache every step with its token history
        copied out on a side stream, and a guided diffusion sampler whose decoder's buffers lie
        beyond the split limits, decoding in halves on OOM. Every self-replay is exact, and
        every what-if pair: the ten that met an OOM under the fraction (and went on at half the
        prompts or images) give PyTorch's first OOM at the same allocation, the rest every
        compared counter; the fit verdict agrees on all 44. CI compares the diffusion job's 23
        runs; the beam job's (81,000 events each, replayed by CI's debug build) is compared by
        hand (README.md), to keep CI short."""
        folder = os.path.join(HERE, "results-wave12")
        exact = self.check_recordings(folder, 22, known=set(), only=r"^diffusion\.")
        self.assertIn("diffusion.pow2div4.frac", exact)  # its first OOM, at PyTorch's allocation
        self.assertIn("diffusion.lseg32_split256.frac", exact)

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_finetune_job_recorded_again(self):
        """results-finetune-again/ (an H100 80GB, 2026-12-06): the tenth wave's finetune job
        recorded again, to check the kept-chunk rule on a recording it was not worked out on.
        Before the replay learnt kept chunks, it gave the same four differing pairs as
        results-wave10; now every pair is exact, and every self-replay. (Its twin recorded with
        CUDA_MODULE_LOADING=EAGER, results-finetune-eager/, is exact with and without the rule
        and is compared by hand, README, to keep CI short.)"""
        self.check_recordings(os.path.join(HERE, "results-finetune-again"), 15, known=set())

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_wrapped_copies_of_the_tenth_wave_replay_exactly_in_their_window(self):
        """The tenth wave's serving job (three streams, record_stream both ways, near its
        memory fraction) and its fine-tuning job under roundup_power2_divisions:4, each trace
        cut to its last 60%, 25% and 5% as PyTorch's history ring would keep it (ringcut.py).
        Each copy's self-replay starts from the state rebuilt at its first event: current
        counters exact, peaks no higher than the whole run's, segment events as recorded.
        Before the replay carved start states beyond the fraction's cap, at sizes no request
        rounds to, and with tails read from where the trace allocates, 13 of these 54 failed.
        One is known: finetune.pow2div4.frac.ring05's inactive_split_bytes peak is an estimate
        (each block the window frees before allocating may have had up to 1 MiB more), and it
        lies 2 MiB above the whole run's."""
        rows, text = self.wrapped_self_replays("results-wave10", r"^(pipeline\.|finetune\.pow2div4)")
        self.assertEqual(len(rows), 54, text)
        wrong = {r["run"]: r["details"] for r in rows if r["verdict"] != "exact in the window"}
        self.assertEqual(sorted(wrong), ["finetune.pow2div4.frac.ring05"], text)
        self.assertRegex(wrong["finetune.pow2div4.frac.ring05"][0],
                         r"^2 counters differ: inactive_split_bytes\.all\.peak .*"
                         r"inactive_split_bytes\.large_pool\.peak")

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_wrapped_copies_hold_private_pools_and_expandable_gaps_as_recorded(self):
        """Wrapped copies (ringcut.py) of four results/ runs whose start states hold what the
        replay once carved wrong: a CUDA graph's private pool (compiled.default: its segments
        carved in the default pools, 51 segment events differed), the same and a MemPool's
        expandable segments with unmapped pages between their ranges (compiled.expandable,
        mem_pools.expandable: the pages stayed mapped, or the state fell back to blocks in
        address order), and a large-pool expandable gap of 1 MiB (bs_search.expandable: it
        went to the small pool). Every copy replays exactly in its window."""
        rows, text = self.wrapped_self_replays(
            "results", r"^(compiled\.default|compiled\.expandable|mem_pools\.expandable"
                       r"|bs_search\.expandable)$")
        self.assertEqual(len(rows), 12, text)
        self.assertEqual([r["run"] for r in rows if r["verdict"] != "exact in the window"], [],
                         text)

    def wrapped_self_replays(self, results, only):
        """The self-replay rows (and compare.py's output) of ringcut.py's copies of the runs
        of `results` (a folder here) that `only` matches."""
        out = os.path.join(self.tmp, "rings")
        with contextlib.redirect_stdout(io.StringIO()):
            ringcut.main([os.path.join(HERE, results), out, "--only", only,
                          "--unpack-to", os.path.join(self.tmp, results)])
        printed = io.StringIO()
        out_json = os.path.join(self.tmp, "rings.json")
        with contextlib.redirect_stdout(printed):
            compare.main([out, "--gpumem", GPUMEM, "--jobs", "2", "--json", out_json])
        with open(out_json) as f:
            return json.load(f)["self_replay"], printed.getvalue()

    @unittest.skipUnless(os.path.exists(GPUMEM), f"no gpumem binary at {GPUMEM}")
    def test_the_resnet_pairs_recorded_again_on_an_h100(self):
        """repeats-h100/repN/ (repeat.sh 3 on an H100 80GB, 2026-12-05): `resnet.base` with
        `.gc06.frac` and `.combo.frac`, three times. PyTorch's counters are the same in every
        repetition and the same as on the H200 (62 cudaMalloc, 45 cudaFree, 1 retry, its OOM
        at allocation 1159): that answer does not move from run to run, and gpumem's (its OOM
        at allocation 756, placement, docs/snapshots.md) is wrong the same way each time."""
        counters = set()
        for rep in sorted(os.listdir(os.path.join(HERE, "repeats-h100"))):
            with self.subTest(rep=rep):
                folder = os.path.join(HERE, "repeats-h100", rep)
                self.check_recordings(folder, 0)
                with tarfile.open(os.path.join(folder, "whatif-results-1.tar")) as tar:
                    for name in ("resnet.gc06.frac", "resnet.combo.frac"):
                        stats = json.load(tar.extractfile(f"runs/{name}.stats.json"))
                        counters.add((name, stats["num_device_alloc"], stats["num_device_free"],
                                      stats["num_alloc_retries"], stats["num_ooms"]))
        self.assertEqual(counters, {("resnet.gc06.frac", 62, 45, 1, 1),
                                    ("resnet.combo.frac", 62, 45, 1, 1)})

    def fake_gpumem(self, answers):
        """A stand-in binary: answers[(pickle name, alloc conf)] = (exit status, JSON or text);
        a replay at another recording's addresses is answered by the key's conf followed by
        `|at RUN.pickle`."""
        table = os.path.join(self.tmp, "answers.json")
        with open(table, "w") as f:
            json.dump({f"{k[0]}|{k[1]}": v for k, v in answers.items()}, f)
        path = os.path.join(self.tmp, "fake_gpumem")
        with open(path, "w") as f:
            f.write(textwrap.dedent(f'''\
                #!/usr/bin/env python3
                import json, os, sys
                a = sys.argv
                key = os.path.basename(a[2]) + "|" + a[a.index("--alloc-conf") + 1]
                if "--addresses-from" in a:
                    key += "|at " + os.path.basename(a[a.index("--addresses-from") + 1])
                rc, out = json.load(open({table!r}))[key]
                print(out if isinstance(out, str) else json.dumps(out), file=sys.stdout if rc == 0 else sys.stderr)
                sys.exit(rc)
                '''))
        os.chmod(path, 0o755)
        return path

    def test_verdicts_with_a_scripted_binary(self):
        trace = [event("alloc", 1000, addr=1), event("alloc", 2000, addr=2),
                 event("free_requested", 1000, addr=1), event("free_completed", 1000, addr=1)]
        # Ended by an uncaught OOM at the second request (recorded rounded up to 2048 bytes).
        ended = trace[:1] + [event("oom", 2048)] + [event("free_requested", 1000, addr=1)]
        stats = {"allocated_bytes.all.peak": 3000, "reserved_bytes.all.peak": 4194304,
                 "num_device_alloc": 2, "num_device_free": 0, "num_alloc_retries": 0,
                 "num_ooms": 0, "requested_bytes.all.peak": 3000}
        make_run(self.runs, "w.base", snapshot={"segments": [], "device_traces": [trace]},
                 role="base", stats=stats, total_memory=10_000_000)
        make_run(self.runs, "w.a.frac", snapshot={"segments": [], "device_traces": [trace]},
                 role="whatif", base="w.base", conf="max_split_size_mb:64", fraction="0.5",
                 stats=dict(stats, num_alloc_retries=1), total_memory=10_000_000)
        make_run(self.runs, "w.b.frac", snapshot={"segments": [], "device_traces": [ended]},
                 role="whatif", base="w.base", fraction="0.25", status="oom", completed=False,
                 stats=dict(stats, num_ooms=1), total_memory=10_000_000)
        report = {"fits": True, "counts": {"events": 4, "recorded_ooms": 0,
                                           "recorded_ooms_reproduced": 0, "ooms": 0},
                  "segment_events": {"differing": 0, "recorded": 0, "replayed": 0},
                  "first_oom": None}
        own = dict(report, final_stats={k: v for k, v in stats.items()
                                        if k != "requested_bytes.all.peak"})
        oom_self = dict(report, counts=dict(report["counts"], recorded_ooms=1,
                                            recorded_ooms_reproduced=1),
                        final_stats=dict(own["final_stats"], num_ooms=1))
        # gpumem numbers events from 1: event 2 is the second request.
        predicted = dict(report, fits=False, first_oom={"index": 2},
                         final_stats=dict(own["final_stats"], num_ooms=1))
        gpumem = self.fake_gpumem({
            ("w.base.pickle", ""): (0, own),
            ("w.a.frac.pickle", "max_split_size_mb:64,per_process_memory_fraction:0.5"):
                (0, dict(own, final_stats=dict(own["final_stats"], num_alloc_retries=1))),
            ("w.base.pickle", "max_split_size_mb:64,per_process_memory_fraction:0.5"): (0, own),
            # At w.a.frac's own addresses the replay gives its counters: placement alone.
            ("w.base.pickle", "max_split_size_mb:64,per_process_memory_fraction:0.5"
                              "|at w.a.frac.pickle"):
                (0, dict(own, final_stats=dict(own["final_stats"], num_alloc_retries=1),
                         placed={"sequence": 0})),
            ("w.b.frac.pickle", "per_process_memory_fraction:0.25"): (0, oom_self),
            ("w.base.pickle", "per_process_memory_fraction:0.25"): (0, predicted),
        })
        rc, text, result = self.run_compare(gpumem)
        pairs = {p["run"]: p for p in result["pairs"]}
        self.assertEqual(pairs["w.a.frac"]["verdict"], "differs")
        self.assertIn(["num_alloc_retries", 1, 0], pairs["w.a.frac"]["fields"])
        self.assertEqual(pairs["w.a.frac"]["at_run_addresses"]["verdict"], "exact", text)
        self.assertIn("[at the run's own segment addresses: exact]", text)
        self.assertIn("1 of 1 exact", text)
        # An exact pair is not replayed again.
        self.assertNotIn("at_run_addresses", pairs["w.b.frac"])
        self.assertEqual(pairs["w.b.frac"]["kind"], "prefix")
        self.assertEqual(pairs["w.b.frac"]["verdict"], "exact", text)
        self.assertIn(["first OOM at allocation #", 1, 1], pairs["w.b.frac"]["fields"])
        selfs = {r["run"]: r for r in result["self_replay"]}
        self.assertEqual(selfs["w.base"]["verdict"], "exact")
        self.assertEqual(selfs["w.b.frac"]["verdict"], "exact")
        self.assertEqual(result["missing_keys"], ["requested_bytes.all.peak"])
        self.assertEqual(rc, 1)
        self.assertIn("num_alloc_retries PyTorch 1 gpumem 0", text)


class RetimeTest(unittest.TestCase):
    """retime.py: a base trace's deferred frees completed where a run completed them, or at
    once, the requests themselves untouched."""

    @staticmethod
    def event(action, addr, size=1024):
        return {"action": action, "addr": addr, "size": size, "stream": 0}

    def test_completions_move_to_the_runs_points_before_its_oom(self):
        e = self.event
        # Block 0 (at 1) is freed on a side stream's behalf: completed after request 3 in the
        # base run, after request 2 (its own free) in the run; block 1 completes at once in both.
        base = [e("alloc", 1), e("alloc", 2), e("free_requested", 1), e("free_requested", 2),
                e("free_completed", 2), e("alloc", 3), e("free_completed", 1)]
        run = [e("alloc", 1), e("alloc", 2), e("free_requested", 1), e("free_completed", 1),
               e("free_requested", 2), e("free_completed", 2), e("oom", 0), e("alloc", 3)]
        out, moved = retime.as_run(base, run)
        self.assertEqual(moved, 1)
        self.assertEqual([(x["action"], x["addr"]) for x in out],
                         [("alloc", 1), ("alloc", 2), ("free_requested", 1),
                          ("free_completed", 1), ("free_requested", 2), ("free_completed", 2),
                          ("alloc", 3)])

    def test_at_once_completes_every_free_that_completes_and_leaves_pending_ones(self):
        e = self.event
        trace = [e("alloc", 1), e("alloc", 2), e("free_requested", 1), e("free_requested", 2),
                 e("alloc", 3), e("free_completed", 1)]
        out, moved = retime.at_once(trace)
        self.assertEqual(moved, 1)
        self.assertEqual([(x["action"], x["addr"]) for x in out],
                         [("alloc", 1), ("alloc", 2), ("free_requested", 1),
                          ("free_completed", 1), ("free_requested", 2), ("alloc", 3)])


class WindowScopeTest(unittest.TestCase):
    """A self-replay of a trace that starts mid-run, judged by the scope gpumem gives."""

    def verdict(self, final, stats):
        run = mock.Mock(stats=stats, meta={"history": {"enabled": "all"}})
        run.events.return_value = []
        report = {"final_stats": final, "counts": {"recorded_ooms": 0,
                                                   "recorded_ooms_reproduced": 0, "ooms": 0},
                  "segment_events": {"differing": 0, "recorded": 0},
                  "final_stats_scope": {"exact": ["allocation.all.current"],
                                        "window_peak": ["allocation.all.peak"],
                                        "window_total": ["allocation.all.allocated"]}}
        result = mock.Mock(report=report)
        return compare.self_replay_verdict(run, result, set())

    def test_window_totals_are_not_compared_and_peaks_may_lie_before(self):
        verdict, details = self.verdict(
            {"allocation.all.current": 3, "allocation.all.peak": 60,
             "allocation.all.allocated": 10},
            {"allocation.all.current": 3, "allocation.all.peak": 69,
             "allocation.all.allocated": 2726})
        self.assertEqual(verdict, "exact in the window")
        self.assertIn("1 totals over the window not compared", details[-1])
        self.assertIn("allocation.all.peak PyTorch 69 gpumem 60", details[-1])

    def test_a_window_peak_above_pytorchs_or_a_wrong_current_is_a_mismatch(self):
        verdict, details = self.verdict(
            {"allocation.all.current": 3, "allocation.all.peak": 70,
             "allocation.all.allocated": 10},
            {"allocation.all.current": 3, "allocation.all.peak": 69,
             "allocation.all.allocated": 2726})
        self.assertEqual(verdict, "MISMATCH")
        self.assertIn("allocation.all.peak PyTorch 69 gpumem 70", details[0])
        verdict, _ = self.verdict(
            {"allocation.all.current": 2, "allocation.all.peak": 69,
             "allocation.all.allocated": 10},
            {"allocation.all.current": 3, "allocation.all.peak": 69,
             "allocation.all.allocated": 2726})
        self.assertEqual(verdict, "MISMATCH")


if __name__ == "__main__":
    unittest.main()
