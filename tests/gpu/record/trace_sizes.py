"""The request sizes of record_traces.py's traces, shared with mark_second_stream_ooms.py (which
replays the same random draws)."""

MIB = 1 << 20


def draw_size(rng, fraction):
    """Sizes that exercise every rule: 512-byte edges, the 1 MiB and 10 MiB pool borders, 2 and
    20 MiB pages, oversize blocks, and (rarely) requests far beyond the device."""
    kind = rng.random()
    if kind < 0.03:
        return 0
    if kind < 0.30:
        return rng.randint(1, MIB)
    if kind < 0.40:
        return rng.choice([511, 512, 513, MIB - 1, MIB, MIB + 1, 2 * MIB, 2 * MIB + 1,
                           10 * MIB - 1, 10 * MIB, 20 * MIB, 20 * MIB + 1, 40 * MIB - 512])
    if kind < 0.70:
        return rng.randint(MIB + 1, 10 * MIB)
    if kind < 0.90:
        return rng.randint(10 * MIB, 200 * MIB)
    if kind < 0.985:
        return rng.randint(200 * MIB, 1100 * MIB)
    return rng.randint(2 << 30, 8 << 30) if fraction < 1.0 else rng.randint(150 << 30, 200 << 30)
