"""probe.py's own tests, without a GPU: the sequences it plays and the data it writes.

Run: python3 -m unittest test_probe (tests/placement_probe.rs runs it in CI)."""
import gzip
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import probe  # noqa: E402

WHATIF = os.path.join(HERE, "..", "whatif")


def read(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


class StandInDriver:
    """The libcuda calls play() makes, handing out addresses from a counter: enough to check
    which calls a sequence makes and with what, not where a real driver puts anything."""

    def __init__(self):
        self.next, self.live, self.sizes, self.modules = 1 << 32, set(), {}, {}

    def _take(self, size):
        address, self.next = self.next, self.next + size
        self.live.add(address)
        self.sizes[address] = size
        return address

    def cuMemAlloc_v2(self, pointer, size):
        pointer._obj.value = self._take(size.value)
        return 0

    def cuMemFree_v2(self, pointer):
        self.live.remove(pointer.value)
        return 0

    def cuModuleLoadData(self, module, ptx):
        size = int(ptx.value.split(b"[")[1].split(b"]")[0])
        handle = len(self.modules) + 1
        self.modules[handle] = self._take(size)
        module._obj.value = handle
        return 0

    def cuModuleGetGlobal_v2(self, pointer, size, module, name):
        assert name == probe.GLOBAL_NAME
        pointer._obj.value = self.modules[module.value]
        size._obj.value = self.sizes[pointer._obj.value]
        return 0

    def cuModuleUnload(self, module):
        self.live.remove(self.modules.pop(module.value))
        return 0

    def cuMemHostAlloc(self, host, size, flags):
        host._obj.value = self._take(size.value)
        return 0

    def cuMemHostGetDevicePointer_v2(self, pointer, host, flags):
        pointer._obj.value = host.value
        return 0

    def cuMemFreeHost(self, host):
        self.live.remove(host.value)
        return 0


class ProbeTests(unittest.TestCase):
    def test_the_recorded_data_is_what_the_exporter_makes_of_the_recordings(self):
        """data/probe-recorded.json.gz, which the model's tests read, is exactly the recordings'
        own segment sequences: rebuilt from the tars, wrapped traces left out."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "recorded.json.gz")
            exported = probe.sequences_from(
                [os.path.join(WHATIF, "results"), os.path.join(WHATIF, "results-frac")], "")
            probe.write_data(out, exported)
            self.assertEqual(read(out), read(os.path.join(HERE, "data", "probe-recorded.json.gz")))
        self.assertFalse(any("ring" in name for name in exported), "wrapped traces are left out")

    def test_random_sequences_are_reproducible_and_free_only_what_they_made(self):
        for seed in range(20):
            ops = probe.random_sequence(seed)
            self.assertEqual(ops, probe.random_sequence(seed))
            live = set()
            for index, (op, size, target, _) in enumerate(ops):
                self.assertEqual(size % (2 << 20), 0)
                if op == "a":
                    live.add(index)
                else:
                    self.assertIn(target, live)
                    self.assertEqual(size, ops[target][1])
                    live.remove(target)

    def test_the_designed_sequences_free_the_segments_that_tell_the_rules_apart(self):
        designed = probe.designed_sequences()
        mib = 1 << 20
        t1 = designed["designed/T1"]
        freed = [t1[op[2]][1] // mib for op in t1 if op[0] == "f"]
        self.assertEqual(freed, [60, 14, 14, 20])
        self.assertEqual([op[1] // mib for op in t1[-2:]], [20, 20])
        t2 = designed["designed/T2"]
        self.assertEqual([t2[op[2]][1] // mib for op in t2 if op[0] == "f"], [60, 14, 14, 30])
        t4 = designed["designed/T4"]
        self.assertEqual([op[1] // mib for op in t4], [2] * 30 + [20, 2])

    def test_others_memory_is_played_between_segments_and_let_go(self):
        """T5 and T6 load a module's global / pin host memory into a freed hole's time, then
        let it go; play() drives the driver's calls for them (a stand-in driver here)."""
        designed = probe.designed_sequences()
        mib = 1 << 20
        for key, kind, release in (("designed/T5", "m", "mu"), ("designed/T6", "h", "hf")):
            ops = designed[key]
            self.assertEqual([op[0] for op in ops], ["a", "a", "f", kind, "a", "a", release, "a"])
            self.assertEqual(ops[6][2], 3, "the release names the memory's op")
            driver = StandInDriver()
            probed = probe.play(ops, "bare", cuda=driver)
            self.assertEqual(len(probed), len(ops))
            self.assertEqual(probed[3], probed[6], "a release reports the address it let go")
            self.assertEqual(driver.live, {probed[1], probed[4], probed[5], probed[7]})
            self.assertEqual(driver.sizes[probed[3]], 14 * mib)
        self.assertIn(b"[14680064];", probe.module_ptx(14 * mib))
        self.assertTrue(probe.module_ptx(1).endswith(b"\0"))


    def test_addresses_are_put_on_mallocs_and_their_frees(self):
        ops = [["a", 4, -1, 0], ["a", 8, -1, 0], ["f", 4, 0, 0]]
        self.assertEqual(probe.with_addresses(ops, [100, 200]),
                         [["a", 4, -1, 100], ["a", 8, -1, 200], ["f", 4, 0, 100]])
        with self.assertRaises(ValueError):
            probe.with_addresses(ops, [100])

    def test_the_kept_probe_data_matches_the_sequences_it_was_played_from(self):
        """The random and designed sequences in data/ are probe.py's own, addresses aside."""
        for name in ("probe-bare.json.gz", "probe-torch.json.gz", "probe-designed.json.gz"):
            data = read(os.path.join(HERE, "data", name))
            designed = probe.designed_sequences()
            for key, ops in data.items():
                kind, which = key.split("/")
                expected = (probe.random_sequence(int(which)) if kind == "random"
                            else designed[key])
                self.assertEqual([op[:3] for op in ops], [op[:3] for op in expected], key)


if __name__ == "__main__":
    unittest.main()
