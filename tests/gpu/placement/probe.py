"""Is the driver's segment placement a function of the cudaMalloc/cudaFree sequence alone?

usage: python3 probe.py --out DIR [--only REGEX] [--jobs N] [--mode torch|bare] [--random N]
           [--designed] [TAR_OR_DIR...]
       python3 probe.py --export FILE.json.gz TAR_OR_DIR...   (no GPU: the recordings' own
           sequences, with their recorded addresses, as the model's tests read them)

For each recorded PyTorch snapshot (non-expandable runs), takes the sequence of its
`segment_alloc`/`segment_free` trace events (sizes, and which earlier segment a free
releases), and plays that sequence against the driver in a fresh process with `cuMemAlloc_v2` /
`cuMemFree_v2` (ctypes on libcuda; never managed memory). `--mode torch` first starts CUDA the
way a PyTorch process does (import torch, create the primary context through it), `bare` only
through the driver API. It writes DIR/probe.json: per recording, the recorded and the probed
address of every segment, and prints how many the driver placed where the recording has them.

If the driver, given a recording's own sequence, puts every segment where the recording has it,
placement is a function of the sequence (and gpumem's placement model can in principle be
exact); where it does not, memory the trace does not show (lazily loaded kernels, library
workspaces, pinned host memory) moved the driver's choices.
"""
import argparse
import concurrent.futures
import ctypes
import glob
import io
import json
import lzma
import os
import pickle
import re
import subprocess
import sys
import tarfile


def sequences_from(paths, only):
    """(name, [[op, size, index_of_alloc_or_-1, recorded_addr]...]) per usable recording."""
    found = {}
    def take(name, raw):
        if only and not re.search(only, name):
            return
        data = pickle.loads(raw)
        traces = data.get("device_traces") or [[]]
        trace = traces[0] if traces else []
        if any(e.get("action") in ("segment_map", "segment_unmap") for e in trace):
            return  # expandable segments: the driver's VMM calls, not cudaMalloc
        ops, live = [], {}
        for event in trace:
            action = event.get("action")
            if action == "segment_alloc":
                live[event["addr"]] = len(ops)
                ops.append(["a", int(event["size"]), -1, int(event["addr"])])
            elif action == "segment_free":
                index = live.pop(event["addr"], None)
                if index is None:
                    return  # the trace starts mid-run (wrapped ring): not a whole sequence
                ops.append(["f", int(event["size"]), index, int(event["addr"])])
        # A trace that starts mid-run (the history ring wrapped) leaves end-state segments it
        # never made: its first segment is not the process's first.
        ends = {int(seg["address"]) for seg in data.get("segments", [])
                if seg.get("device", 0) == 0 and "address" in seg}
        if ops and ends <= set(live):
            found[name] = ops
    expanded = []
    for path in paths:
        tars = sorted(glob.glob(os.path.join(path, "*.tar"))) if os.path.isdir(path) else []
        expanded += [(path, tar) for tar in tars] or [(path, path)]
    for given, path in expanded:
        prefix = os.path.basename(os.path.normpath(given)) + "/"
        if os.path.isdir(path):
            for member in sorted(glob.glob(os.path.join(path, "**", "*.pickle*"), recursive=True)):
                raw = open(member, "rb").read()
                if member.endswith(".xz"):
                    raw = lzma.decompress(raw)
                take(prefix + re.sub(r"\.pickle(\.xz)?$", "", os.path.basename(member)), raw)
        else:
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    if ".pickle" not in member.name:
                        continue
                    raw = tar.extractfile(member).read()
                    if member.name.endswith(".xz"):
                        raw = lzma.decompress(raw)
                    take(prefix + re.sub(r"\.pickle(\.xz)?$", "", os.path.basename(member.name)), raw)
    return found


def with_addresses(ops, probed):
    """A sequence's calls with the addresses the driver gave: each malloc its own, each free
    its malloc's."""
    ops = [list(op) for op in ops]
    allocs = [op for op in ops if op[0] == "a"]
    if len(allocs) != len(probed):
        raise ValueError(f"{len(probed)} addresses for {len(allocs)} mallocs")
    for op, address in zip(allocs, probed):
        op[3] = address
    for op in ops:
        if op[0] == "f":
            op[3] = ops[op[2]][3]
    return ops


def write_data(path, sequences):
    """The form `driver_tests` (src/device/address_space.rs) reads: gzipped JSON, name → calls
    [op, size, index of the malloc a free releases (-1 for a malloc), address]."""
    import gzip
    with gzip.open(path, "wt") as f:
        json.dump(sequences, f, separators=(",", ":"))


def random_sequence(seed, length=80):
    """A random sequence of mallocs and frees, recorded addresses unknown (0)."""
    import random
    rng = random.Random(seed)
    mib = 1 << 20
    ops, live = [], []
    for _ in range(length):
        if live and rng.random() < 0.4:
            index = live.pop(rng.randrange(len(live)))
            ops.append(["f", ops[index][1], index, 0])
            continue
        kind = rng.random()
        if kind < 0.25:
            size = 2 * mib
        elif kind < 0.45:
            size = 20 * mib
        elif kind < 0.85:
            size = rng.randrange(2, 72, 2) * mib
        else:
            size = rng.randrange(72, 202, 2) * mib
        live.append(len(ops))
        ops.append(["a", size, -1, 0])
    return ops


def designed_sequences():
    """Sequences that tell placement rules apart inside one chunk (sizes in MiB): a hole made
    of two adjacent frees of 14 below a single freed hole of 20 (T1) or 30 (T2), then a 20
    MiB request. Lowest coalesced hole first puts it at the bottom in both; best fit at the
    20 in T1 and the bottom in T2; a free list that merges only when nothing fits at the
    higher hole in both."""
    def build(upper):
        names, ops = {}, []
        def alloc(name, mib):
            names[name] = len(ops)
            ops.append(["a", mib << 20, -1, 0])
        def free(name):
            ops.append(["f", ops[names[name]][1], names[name], 0])
        alloc("big", 60)
        alloc("c2", 2)
        alloc("e2", 2)
        free("big")
        alloc("a", 14)
        alloc("b", 14)
        alloc("c", 2)
        alloc("d", upper)
        if upper < 30:
            alloc("pad", 30 - upper)
        free("a")
        free("b")
        free("d")
        alloc("x", 20)
        alloc("y", 20)
        return ops
    # T3: 2 MiB segments until the start's ranges are full and chunks are opened for them,
    # then a 20 MiB one (the last such chunk has 10 MiB left: a chunk of its own either way).
    small_then_large = [["a", 2 << 20, -1, 0] for _ in range(40)] + [["a", 20 << 20, -1, 0],
                                                                    ["a", 2 << 20, -1, 0]]
    # T4: as T3, but stopping at 30 small segments, so that the last chunk opened for one has
    # 30 MiB of room when the 20 MiB request comes.
    room_left = [["a", 2 << 20, -1, 0] for _ in range(30)] + [["a", 20 << 20, -1, 0],
                                                            ["a", 2 << 20, -1, 0]]
    return {"designed/T1": build(20), "designed/T2": build(30), "designed/T3": small_then_large,
            "designed/T4": room_left, "designed/T5": others_between("m"),
            "designed/T6": others_between("h")}


def others_between(kind):
    """T5 (`kind` "m", a module's 14 MiB global) and T6 ("h", 14 MiB of pinned host memory):
    does others' memory take a freed hole of the segments' chunk, a chunk of its own, or
    none the driver's segments see? Two 20 MiB segments, the lower freed (a 20 MiB hole);
    then the other memory; then a 14 MiB segment (in the hole, unless the memory took it) and
    a 2 MiB one; the memory let go; another 14 MiB segment (where the memory was?)."""
    mib = 1 << 20
    ops = [["a", 20 * mib, -1, 0], ["a", 20 * mib, -1, 0], ["f", 20 * mib, 0, 0],
           [kind, 14 * mib, -1, 0], ["a", 14 * mib, -1, 0], ["a", 2 * mib, -1, 0]]
    ops.append([HIDDEN_ALLOCS[kind], 14 * mib, 3, 0])
    ops.append(["a", 14 * mib, -1, 0])
    return ops


# Memory others hold, played between segments (`designed/T5`, `T6`): ops `m` (a kernel
# module with a SIZE-byte device global, as a library's or a lazily loaded kernel's module
# takes device memory) and `mu` (its unload), `h` (SIZE bytes of pinned host memory,
# `cuMemHostAlloc`, which takes addresses from the same unified address space) and `hf` (its
# free). Each records the device address it got, so the data show whether such memory lands
# in the chunks and holes that segments use.
HIDDEN_ALLOCS = {"m": "mu", "h": "hf"}
GLOBAL_NAME = b"gpumem_probe_global"


def module_ptx(size):
    """PTX text of a module holding one uninitialised device global of `size` bytes."""
    return (".version 8.0\n.target sm_90\n.address_size 64\n"
            f".visible .global .align 16 .b8 {GLOBAL_NAME.decode()}[{size}];\n").encode() + b"\0"


def start(mode):
    """libcuda, with a context current: through PyTorch (`torch`) or the driver API (`bare`)."""
    if mode == "torch":
        import torch
        torch.cuda.init()
        torch.cuda.current_stream().synchronize()  # the primary context is current now
    cuda = ctypes.CDLL("libcuda.so.1")
    if mode == "bare":
        assert cuda.cuInit(0) == 0
        device, context = ctypes.c_int(), ctypes.c_void_p()
        assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
        assert cuda.cuCtxSetCurrent(context) == 0
    return cuda


def play(ops, mode, cuda=None):
    """Runs one sequence in this process; returns the probed address of every op (a free's:
    the address it released; None for a call that failed). `cuda`: libcuda, or a stand-in
    (tests); started by `start(mode)` when not given."""
    if cuda is None:
        cuda = start(mode)
    probed, pointers, handles = [], {}, {}
    for i, (op, size, index, _) in enumerate(ops):
        if op == "a":
            pointer = ctypes.c_uint64()
            rc = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
            if rc != 0:
                probed.append(None)
                continue
            pointers[i] = pointer.value
            probed.append(pointer.value)
        elif op == "f":
            pointer = pointers.pop(index, None)
            if pointer is not None:
                assert cuda.cuMemFree_v2(ctypes.c_uint64(pointer)) == 0
            probed.append(pointer)
        elif op == "m":
            module, pointer, got = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_size_t()
            ptx = ctypes.c_char_p(module_ptx(size))
            if cuda.cuModuleLoadData(ctypes.byref(module), ptx) != 0:
                probed.append(None)
                continue
            # Asking for the global loads it, lazy loading or not.
            assert cuda.cuModuleGetGlobal_v2(ctypes.byref(pointer), ctypes.byref(got), module,
                                             GLOBAL_NAME) == 0
            assert got.value == size
            handles[i] = (module.value, pointer.value)
            probed.append(pointer.value)
        elif op == "h":
            host, pointer = ctypes.c_void_p(), ctypes.c_uint64()
            if cuda.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(size), 0) != 0:
                probed.append(None)
                continue
            assert cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(pointer), host, 0) == 0
            handles[i] = (host.value, pointer.value)
            probed.append(pointer.value)
        elif op in ("mu", "hf"):
            handle, pointer = handles.pop(index, (None, None))
            if handle is not None:
                release = cuda.cuModuleUnload if op == "mu" else cuda.cuMemFreeHost
                assert release(ctypes.c_void_p(handle)) == 0
            probed.append(pointer)
        else:
            raise ValueError(f"unknown op {op!r} at {i}")
    return probed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--export", help="write the recordings' sequences to this .json.gz and stop")
    p.add_argument("--only", default="")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--mode", default="torch", choices=["torch", "bare"])
    p.add_argument("--random", type=int, default=0,
                   help="also play N random sequences (seeded 0..N-1) of segment sizes PyTorch "
                        "makes: 2 MiB, 20 MiB, and 2 MiB multiples up to 200 MiB")
    p.add_argument("--designed", action="store_true",
                   help="also play the designed sequences (T1-T6; --random N plays them too)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("paths", nargs="*")
    args = p.parse_args()
    if args.one:
        ops = json.load(open(args.one))
        json.dump(play(ops, args.mode), sys.stdout)
        return
    if args.export:
        sequences = {name: ops for name, ops in sequences_from(args.paths, args.only).items()}
        write_data(args.export, sequences)
        print(f"{len(sequences)} recordings written to {args.export}")
        return
    if not args.out:
        p.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    sequences = sequences_from(args.paths, args.only)
    if args.random or args.designed:
        sequences.update(designed_sequences())
    for seed in range(args.random):
        sequences[f"random/{seed}"] = random_sequence(seed)
    work = os.path.join(args.out, "sequences")
    os.makedirs(work, exist_ok=True)

    def run(name):
        path = os.path.join(work, name.replace("/", "__") + ".json")
        json.dump(sequences[name], open(path, "w"))
        done = subprocess.run([sys.executable, __file__, "--out", args.out, "--mode", args.mode,
                               "--one", path], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return name, {"error": done.stderr[-2000:]}
        probed = json.loads(done.stdout)
        ops = sequences[name]
        hidden = [[i, op[0], op[1], got] for i, (op, got) in enumerate(zip(ops, probed))
                  if op[0] not in ("a", "f")]
        allocs = [(op[3], got) for op, got in zip(ops, probed) if op[0] == "a"]
        same = sum(1 for recorded, got in allocs if recorded == got)
        first_wrong = next((i for i, (r, g) in enumerate(allocs) if r != g), None)
        return name, {"segments": len(allocs), "same": same, "first_differing": first_wrong,
                      "recorded": [r for r, _ in allocs], "probed": [g for _, g in allocs],
                      "sizes": [op[1] for op in ops if op[0] == "a"],
                      # others' memory: [op index, op, size, device address]
                      "others": hidden}

    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name, result in pool.map(run, sorted(sequences)):
            results[name] = result
            if "error" in result:
                print(f"{name}: error {result['error'][-300:]}", flush=True)
            else:
                print(f"{name}: {result['same']}/{result['segments']} placed as recorded"
                      f" (first differing: {result['first_differing']})", flush=True)
                for index, op, size, got in result["others"]:
                    print(f"  {name} op {index} {op} {size >> 20} MiB at "
                          f"{'failed' if got is None else hex(got)}", flush=True)
                if result["others"]:
                    print(f"  {name} segments at " + " ".join(
                        "failed" if got is None else hex(got) for got in result["probed"]),
                        flush=True)
    json.dump(results, open(os.path.join(args.out, "probe.json"), "w"))
    # The model's tests read segments only: sequences with others' memory are kept in
    # probe.json ("others") and left out of the data file.
    played = {name: with_addresses(sequences[name], result["probed"])
              for name, result in results.items()
              if "error" not in result and not result["others"]}
    write_data(os.path.join(args.out, "probe-data.json.gz"), played)
    whole = sum(1 for r in results.values() if r.get("segments") == r.get("same"))
    total = sum(r.get("segments", 0) for r in results.values())
    same = sum(r.get("same", 0) for r in results.values())
    print(f"{whole}/{len(results)} recordings placed exactly; {same}/{total} segments")


if __name__ == "__main__":
    main()
