"""Repairs stream fixtures recorded before record_traces.py marked refused allocations with
their stream: an allocation refused on the second stream was written as ["alloc", k, n, "oom"]
without "stream1". record_traces.py draws every random number before it allocates and draws the
same ones whatever the outcome, so replaying its generator tells which ops were on the second
stream. Used once on the three *streams* fixtures in tests/fixtures/pytorch-traces/

usage: mark_second_stream_ooms.py FIXTURE.json.gz   (rewritten in place)
"""
import gzip
import json
import random
import sys

from trace_sizes import draw_size

path = sys.argv[1]
fixture = json.load(gzip.open(path, "rt"))
fraction = fixture["memory_fraction"]


fixed = 0
for trace in fixture["traces"]:
    rng = random.Random(trace["seed"])
    for step in trace["ops"]:
        r = rng.random()
        k = rng.randrange(12)
        op = step["op"]
        if r < 0.62:
            n = draw_size(rng, fraction)
            on_second = rng.random() < 0.33
            assert op[0] == "alloc" and op[1] == k and op[2] == n, (op, k, n)
            if on_second and "stream1" not in op:
                assert op[-1] == "oom", op
                op.insert(3, "stream1")
                fixed += 1
        elif r < 0.95:
            assert op == ["free", k], (op, k)
        else:
            assert op == ["empty_cache"], op
with gzip.open(path, "wt") as out:
    json.dump(fixture, out)
print(f"{path}: {fixed} refused allocations marked as on the second stream")
