"""Request sequences of PyTorch memory snapshots, read with Python's pickle module alone.

A what-if comparison is fair only when both runs asked the allocator for the same things: the
same (action, size, stream) for every `alloc` and `free_requested`, in the same order. A
deterministic program does that whatever the allocator config, but autograd frees some tensors
in an order that depends on their addresses, and a program that catches OOMs takes another
path when they move (whatif-method.md). Stream ids are per-process handles, so streams are
numbered by first use.

The snapshot is untrusted input: the unpickler refuses every class and function, so a file
can hold only the plain dicts, lists, strings and numbers PyTorch writes.
"""
import pickle

REQUESTS = ("alloc", "free_requested")


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only built-in containers and scalars."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a snapshot holds no objects, but this one names "
                                     f"{module}.{name}")


def load_snapshot(path):
    """The snapshot dict of a `_dump_snapshot` pickle."""
    with open(path, "rb") as f:
        return PlainUnpickler(f).load()


def trace_of(snapshot, device=0):
    """The trace events of one device (an empty list when none were recorded)."""
    traces = snapshot.get("device_traces") or []
    return traces[device] if device < len(traces) else []


def request_sequence(events, stop_at=None):
    """[(action, size, stream number)] of the `alloc` and `free_requested` events, streams
    numbered 0, 1, ... by first use; only events before index `stop_at` when given."""
    streams = {}
    sequence = []
    for index, event in enumerate(events):
        if stop_at is not None and index >= stop_at:
            break
        if event["action"] in REQUESTS:
            stream = streams.setdefault(event["stream"], len(streams))
            sequence.append((event["action"], event["size"], stream))
    return sequence


def first_difference(a, b):
    """The first position where sequences a and b differ (a length counts as a position),
    with both entries (None past an end); None when they are equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position, x, y
    if len(a) != len(b):
        position = min(len(a), len(b))
        return (position, a[position] if position < len(a) else None,
                b[position] if position < len(b) else None)
    return None


def first_oom_index(events):
    """Index of the first `oom` event, or None."""
    for index, event in enumerate(events):
        if event["action"] == "oom":
            return index
    return None


def allocs_before(events, index):
    """How many `alloc` events come before position `index`: the ordinal of the request at
    `index` among the allocations, the same in two runs whose sequences agree up to there."""
    return sum(1 for event in events[:index] if event["action"] == "alloc")


SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")


def completions(events):
    """{allocation ordinal: (requests before its completion, whether a segment event or an OOM
    follows the completion before the next request, whether the `free_completed` followed its
    `free_requested` at once)} for every block whose free completed."""
    return {block: facts[:3] for block, facts in completions_and_survivors(events).items()}


def completions_and_survivors(events):
    """completions(), each with a fourth fact: whether another free requested before it was
    still pending once its run of completions ended. A synchronisation of the allocator (the OOM
    path's `synchronize_and_free_events`, `empty_cache()`'s) completes every pending free in one
    run; a completion that left another pending was the allocator finding that free's work done
    (`process_events`), so GPU timing alone put it there."""
    ordinal_at = {}
    completed = {}
    ordinal = requests = 0
    open_blocks = []
    pending = set()
    in_run = []
    previous = None
    for event in events:
        action = event["action"]
        if action != "free_completed" and in_run:
            for block in in_run:
                completed[block] = completed[block][:3] + (bool(pending),)
            in_run = []
        if action == "free_requested":
            pending.add(event["addr"])
        if action in ("alloc", "free_requested"):
            open_blocks = []
            requests += 1
            if action == "alloc":
                ordinal_at[event["addr"]] = ordinal
                ordinal += 1
        elif action in SEGMENT_ACTIONS:
            for block in open_blocks:
                at, _, at_once, survived = completed[block]
                completed[block] = (at, True, at_once, survived)
            open_blocks = []
        elif action == "free_completed":
            at_once = (previous is not None and previous["action"] == "free_requested"
                       and previous["addr"] == event["addr"])
            pending.discard(event["addr"])
            block = ordinal_at.pop(event["addr"], None)
            if block is not None:
                completed[block] = (requests, False, at_once, False)
                open_blocks.append(block)
                in_run.append(block)
        previous = event
    for block in in_run:
        completed[block] = completed[block][:3] + (bool(pending),)
    return completed


def deferred_completions(events):
    """{allocation ordinal: (requests before its completion, whether a segment event or an OOM
    follows the completion before the next request)} for every block whose `free_completed`
    did not follow its `free_requested` at once: a free `record_stream` deferred until the side
    stream's work was done, completed when the allocator found it done (GPU timing) or when it
    synchronised (its own decision)."""
    return {block: (at, then_segments)
            for block, (at, then_segments, at_once) in completions(events).items()
            if not at_once}


def completed_otherwise(base_events, run_events, run_stats):
    """The first block (allocation ordinal, base's and run's request count at its completion)
    whose deferred free completed at another point in the run than in the base run for a reason
    only the GPU's timing gives, or None.

    The allocator never delays a completion: only its synchronisations complete pending frees
    early (`num_sync_all_streams`: the OOM path's, each followed by its retry, counted by
    `num_alloc_retries`, which makes a segment or raises an OOM; and empty_cache()'s). A later
    completion therefore shows the GPU took longer in the run; so does an earlier one in a run
    that never synchronised, or, in a run whose every synchronisation was an OOM path's retry,
    an earlier one that no segment event or OOM follows before the next request. Either way the
    run's input differed from the base run's, which no replay of the base run can know.

    An earlier completion that left another free pending was no synchronisation (one completes
    them all); a run with more points of earlier completion than synchronisations had some that
    were none, and so had one with more such points, none followed by a segment event or an
    OOM, than `empty_cache()` calls (synchronisations less retries).

    A free deferred in one run may complete at once in the other (the work it waited for was
    already done at the next malloc): deferred on either side counts. A deferred free completed
    after the same request in both runs, but in the base run with no segment event after it
    and in a run that retried right before one, was done before the next malloc in the base
    run and perhaps only on the run's OOM path, after that malloc failed: the trace cannot
    tell the two apart, and a replay of the base run hands the block to the malloc. A run ended by an
    uncaught OOM is given up to its `oom` event (whose path completed every pending free before
    it), and only the frees it completed are compared."""
    syncs = run_stats.get("num_sync_all_streams")
    retries = run_stats.get("num_alloc_retries")
    base = completions(base_events)
    run = completions_and_survivors(run_events)
    # Each synchronisation completes the pending frees in one run: more points of earlier
    # completion than the run synchronised can only be the GPU's timing.
    def deferred_somewhere(block):
        return block in base and not (run[block][2] and base[block][2])

    earlier_points = {facts[0] for block, facts in run.items()
                      if deferred_somewhere(block) and facts[0] < base[block][0]}
    too_many = syncs is not None and len(earlier_points) > syncs
    # An OOM path's synchronisation is followed by its retry (a segment event or an `oom`):
    # earlier completions with none after them were `empty_cache()` calls', of which the run
    # made `syncs - retries`.
    plain_points = {facts[0] for block, facts in run.items()
                    if deferred_somewhere(block) and facts[0] < base[block][0] and not facts[1]}
    too_many_plain = (syncs is not None and retries is not None
                      and len(plain_points) > syncs - retries)
    for block in sorted(run):
        if block not in base:
            continue
        at, then_segments, at_once, survived = run[block]
        if at == base[block][0]:
            # The same request, but done before it in the base run (no segment event after
            # the completion, the GPU's timing) and in the run only where its OOM path
            # synchronised (a retry's segment event after it): a replay of the base run
            # hands the block to that request's malloc, where the run had it only after the
            # malloc failed. Which it was in the run, no trace tells.
            if then_segments and not base[block][1] and not base[block][2] and retries:
                return block, base[block][0], at
            continue
        if at_once and base[block][2]:
            continue
        earlier = at < base[block][0]
        # An earlier completion that left another free pending: no synchronisation.
        unsynchronised = earlier and survived
        if at > base[block][0] or syncs == 0 or unsynchronised or (earlier and too_many) or \
                (earlier and not then_segments and too_many_plain):
            return block, base[block][0], at
    return None
