"""Which runs the what-if harness makes: the configs, the workloads under them, and the special
recordings of issue 17. run_all.py executes this plan; compare.py reads only the runs' meta
files, so a plan changed later still compares.

Naming: WORKLOAD.base is the workload under PyTorch's defaults with no fraction (phase 1, the
snapshot every what-if replay starts from); WORKLOAD.LABEL ran under config LABEL;
WORKLOAD.LABEL.frac also under a tight per-process memory fraction, 1.1 x the base run's
allocated_bytes.all.peak / total_memory (whatif-method.md), so the OOM path runs.
"""
from dataclasses import dataclass, field

GIB = 1 << 30

# (label, PYTORCH_CUDA_ALLOC_CONF, only with a fraction). garbage_collection_threshold acts
# only under a fraction below 1, so alone it runs only with one. large_segment_size_mb is a
# 2.11 key (c10/core/AllocatorConfig.h: "large_segment_size_mb", default 20 MiB; must be > 10).
CONFIGS = [
    ("default", "", False),
    ("expandable", "expandable_segments:True", False),
    ("split64", "max_split_size_mb:64", False),
    ("split128", "max_split_size_mb:128", False),
    ("pow2div4", "roundup_power2_divisions:4", False),
    ("gc06", "garbage_collection_threshold:0.6", True),
    ("combo", "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4],"
              "garbage_collection_threshold:0.6", False),
    ("lseg64", "large_segment_size_mb:64", False),
]

# Workloads run under every config, with and without the tight fraction.
WHATIF_WORKLOADS = ["transformer_ckpt", "unet", "kv_decoder", "prefetch", "compiled", "moe"]
# A second wave under the same configs, added to find what the first six did not show: a
# channels_last ResNet with an evaluation pass, mixed precision with gradient accumulation and
# changing sequence lengths, a cuDNN LSTM, and batched inference over varying shapes.
WHATIF_WORKLOADS += ["resnet", "amp_lm", "lstm", "serve"]
# A third wave, written after the replay's placement model was fitted to the first two, to check
# it where it was not fitted (results-wave3/): a vision transformer, activations offloaded on a
# side stream, packed batches of a new token count every step.
WHATIF_WORKLOADS += ["vit", "offload", "varlen"]
# A fourth wave, for the hardest places (results-wave4/): CUDA graphs sharing a pool beside a
# MemPool, gradient buckets made on a side stream, a large-vocabulary loss in chunks.
WHATIF_WORKLOADS += ["graph_decode", "buckets", "chunked_ce"]
# A fifth (results-wave5/): private pools that go away while the job runs, a CUDA graph evicted
# (its pool freeable, released by the OOM path or empty_cache()) and a MemPool destroyed.
WHATIF_WORKLOADS += ["graph_evict"]
# A sixth (results-wave6/): a MemPool emptied and filled again between training steps, then
# destroyed with no empty_cache() after it.
WHATIF_WORKLOADS += ["pool_phases"]
# A seventh (results-wave7/), written after the replay learnt to infer MemPools from garbage
# collection and from their releases: a long-lived feature pool and short-lived scratch pools
# beside training.
WHATIF_WORKLOADS += ["pool_cache"]
# An eighth (results-wave8/), also not fitted: a batch-size search inside a MemPool, its OOMs
# caught.
WHATIF_WORKLOADS += ["pool_retry"]
# A ninth (results-wave9/), written after the eighth wave's fixes: a MemPool fed from a side
# stream (record_stream), swapped for a fresh one while a free is deferred, and an evaluation
# searching its batch inside a kept MemPool.
WHATIF_WORKLOADS += ["pool_side"]
# A tenth (results-wave10/), written after the ninth wave's fixes, not fitted: the default pools
# under a serving process's three streams (record_stream both ways, a model swapped midway) and
# a fine-tuning script's habits (accumulation, clipping, evaluation then empty_cache(), an
# evaluation's OOM caught and retried at half the batch, a checkpoint cloned on the device).
WHATIF_WORKLOADS += ["pipeline", "finetune"]
# An eleventh (results-wave11/), written after the tenth session and not fitted: a run resumed
# from a checkpoint (torch.load onto the device) then served in float16, and video clips of a
# new size every step, whose buffers lie beyond any max_split_size_mb. They also run under
# EXTRA_CONFIGS.
WHATIF_WORKLOADS += ["resume", "frames"]

# Configs no earlier wave ran, for the eleventh wave's workloads only (the earlier waves'
# plans, and so their recordings, stay as they were): a rounding limit for oversize blocks
# (max_non_split_rounding_mb), expandable segments with a split limit and with a collection
# threshold (fraction only: the threshold acts only under a fraction), and 8 divisions.
EXTRA_CONFIGS = [
    ("nonsplit256", "max_split_size_mb:64,max_non_split_rounding_mb:256", False),
    ("exp_split128", "expandable_segments:True,max_split_size_mb:128", False),
    ("exp_gc08", "expandable_segments:True,garbage_collection_threshold:0.8", True),
    ("pow2div8", "roundup_power2_divisions:8", False),
]

# A twelfth (results-wave12/), written after the eleventh session and not fitted: beam search
# re-ordering its KV cache every step (the token history copied out on a side stream) and a
# diffusion sampler with classifier-free guidance whose decoder's buffers outgrow the
# sampler's. They run under CONFIGS and TWELFTH_CONFIGS, four more configs no earlier wave ran:
# expandable segments with rounding divisions, a small split limit with a high collection
# threshold (fraction only), a larger segment size with a large split limit, and 2 divisions.
WHATIF_WORKLOADS += ["beam", "diffusion"]
TWELFTH_CONFIGS = [
    ("exp_pow2div4", "expandable_segments:True,roundup_power2_divisions:4", False),
    ("split32_gc09", "max_split_size_mb:32,garbage_collection_threshold:0.9", True),
    ("lseg32_split256", "large_segment_size_mb:32,max_split_size_mb:256", False),
    ("pow2div2", "roundup_power2_divisions:2", False),
]

# The configs a workload runs under besides CONFIGS: each wave from the eleventh on brings
# configs of its own for its own workloads, so the earlier waves' plans (and recordings) stay
# as they were.
EXTRA_CONFIGS_OF = {"resume": EXTRA_CONFIGS, "frames": EXTRA_CONFIGS,
                    "beam": TWELFTH_CONFIGS, "diffusion": TWELFTH_CONFIGS}

# The batch-size search always runs under its own limit (the fraction it searches within).
BS_SEARCH_LIMIT = 3 * GIB

# Seconds: a run's own limit, and what the driver assumes a run takes when it decides whether
# one more can still start before the deadline.
TIMEOUT_S = 120
COMPILED_TIMEOUT_S = 180
WARMUP_TIMEOUT_S = 300
CPP_STACKS_TIMEOUT_S = 240
EXPECTED_S = 30
COMPILED_EXPECTED_S = 45


@dataclass
class RunSpec:
    """One process to run: a workload under a config, with its history options."""
    name: str
    workload: str
    role: str  # base | whatif | special | warmup
    conf: str = ""
    config_label: str = "default"
    base: str = ""  # the base run: its snapshot is replayed under this run's config
    tight_fraction: bool = False  # fraction = 1.1 x the base run's allocated peak / total
    limit_bytes: int = 0  # fraction = limit_bytes / total (the workload's own limit)
    max_entries: int = 1_000_000
    context: str = "alloc"
    stacks: str = "python"
    no_history: bool = False
    skip_actions: str = ""
    timeout_s: int = TIMEOUT_S
    expected_s: int = EXPECTED_S
    priority: int = 5  # lower starts first among the runs ready to start
    needs: list = field(default_factory=list)  # runs that must end first
    note: str = ""

    def argv(self, out_dir, fraction=None):
        """run_one.py's arguments for this run (fraction: the tight fraction, as text)."""
        args = ["--name", self.name, "--workload", self.workload, "--out", out_dir,
                "--conf", self.conf, "--role", self.role, "--config-label", self.config_label,
                "--max-entries", str(self.max_entries), "--context", self.context,
                "--stacks", self.stacks]
        if self.base:
            args += ["--base", self.base]
        if self.no_history:
            args.append("--no-history")
        if self.skip_actions:
            args += ["--skip-actions", self.skip_actions]
        if self.limit_bytes:
            args += ["--limit-bytes", str(self.limit_bytes)]
        elif fraction is not None:
            args += ["--fraction", fraction]
        return args


def tight_fraction(base_stats, total_memory):
    """1.1 x the base run's allocated_bytes.all.peak as a fraction of the device, as the text
    passed both to PyTorch and to gpumem (the same double on both sides)."""
    peak = base_stats["allocated_bytes.all.peak"]
    if peak <= 0 or total_memory <= 0:
        raise ValueError(f"no allocated peak to size a fraction from (peak {peak})")
    return format(min(1.0, 1.1 * peak / total_memory), ".6g")


def build_plan():
    """Every run of the harness, in no particular order (priorities and needs order them)."""
    runs = []
    compile_kw = dict(timeout_s=COMPILED_TIMEOUT_S, expected_s=COMPILED_EXPECTED_S)
    # Compiles the reduce-overhead model once, unrecorded, so every recorded compiled run
    # finds a warm compile cache and makes the same requests (a cold compile benchmarks
    # kernels on the GPU, a warm one does not).
    runs.append(RunSpec("compiled.warmup", "compiled", "warmup", no_history=True,
                        timeout_s=WARMUP_TIMEOUT_S, expected_s=90, priority=0,
                        note="fills the compile cache; not compared"))
    for workload in WHATIF_WORKLOADS:
        extra = dict(compile_kw, needs=["compiled.warmup"]) if workload == "compiled" else {}
        base = f"{workload}.base"
        runs.append(RunSpec(base, workload, "base", priority=1 if workload == "compiled" else 2,
                            **extra))
        extra_configs = EXTRA_CONFIGS_OF.get(workload, [])
        for label, conf, fraction_only in CONFIGS + extra_configs:
            if not fraction_only:
                runs.append(RunSpec(f"{workload}.{label}", workload, "whatif", conf=conf,
                                    config_label=label, base=base, priority=4, **extra))
            frac = dict(extra)
            frac["needs"] = frac.get("needs", []) + [base]
            runs.append(RunSpec(f"{workload}.{label}.frac", workload, "whatif", conf=conf,
                                config_label=label, base=base, tight_fraction=True,
                                priority=6, **frac))
    # CUDA-graph captures beyond the what-if workloads, for the self-replay only (issue 16:
    # every capture's empty_cache() counted): a compiled language model recording training
    # and inference graphs, and captures written by hand (torch.cuda.graph,
    # make_graphed_callables), each with and without the tight fraction.
    runs.append(RunSpec("compiled_lm.warmup", "compiled_lm", "warmup", no_history=True,
                        timeout_s=WARMUP_TIMEOUT_S, expected_s=90, priority=0,
                        note="fills the compile cache; not compared"))
    for workload, extra in (("compiled_lm", dict(compile_kw, needs=["compiled_lm.warmup"])),
                            ("user_graphs", {})):
        base = f"{workload}.base"
        runs.append(RunSpec(base, workload, "base", priority=2, **extra))
        frac = dict(extra)
        frac["needs"] = frac.get("needs", []) + [base]
        runs.append(RunSpec(f"{workload}.default.frac", workload, "whatif", conf="",
                            config_label="default", base=base, tight_fraction=True,
                            priority=6, **frac))
    # Pools, shapes and streams beyond the what-if workloads (issue 16), each under the
    # defaults, expandable segments and max_split_size_mb:64, with and without the fraction.
    runs.append(RunSpec("compiled_shapes.warmup", "compiled_shapes", "warmup",
                        no_history=True, timeout_s=WARMUP_TIMEOUT_S, expected_s=90,
                        priority=0, note="fills the compile cache; not compared"))
    for workload in ("mem_pools", "compiled_shapes", "two_streams"):
        extra = (dict(compile_kw, needs=[f"{workload}.warmup"])
                 if workload == "compiled_shapes" else {})
        base = f"{workload}.base"
        runs.append(RunSpec(base, workload, "base", priority=2, **extra))
        for label, conf in (("default", ""), ("expandable", "expandable_segments:True"),
                            ("split64", "max_split_size_mb:64")):
            if label != "default":
                runs.append(RunSpec(f"{workload}.{label}", workload, "whatif", conf=conf,
                                    config_label=label, base=base, priority=4, **extra))
            frac = dict(extra)
            frac["needs"] = frac.get("needs", []) + [base]
            runs.append(RunSpec(f"{workload}.{label}.frac", workload, "whatif", conf=conf,
                                config_label=label, base=base, tight_fraction=True,
                                priority=6, **frac))
    runs.append(RunSpec("bs_search.base", "bs_search", "base", limit_bytes=BS_SEARCH_LIMIT,
                        priority=2, note="batch-size search catching OOMs under a fraction"))
    for label, conf, _ in CONFIGS:
        runs.append(RunSpec(f"bs_search.{label}", "bs_search", "whatif", conf=conf,
                            config_label=label, base="bs_search.base",
                            limit_bytes=BS_SEARCH_LIMIT, priority=5))
    runs += [
        RunSpec("special.ring_unet", "unet", "special", max_entries=4000, priority=3,
                note="history ring wrapped: the trace starts mid-run"),
        RunSpec("special.ring_prefetch", "prefetch", "special", max_entries=5000, priority=3,
                note="ring wrapped, with deferred side-stream frees"),
        RunSpec("special.no_frames", "kv_decoder", "special", context="none", priority=3,
                note="context=None: no frames; empty_cache() between requests"),
        RunSpec("special.cpp_stacks", "mlp", "special", stacks="all", priority=1,
                timeout_s=CPP_STACKS_TIMEOUT_S, expected_s=90,
                note="stacks='all': C++ frames (slow to symbolize)"),
        RunSpec("special.no_history", "unet", "special", no_history=True, priority=3,
                note="snapshot without _record_memory_history: an empty trace"),
        RunSpec("special.skip_free_requested", "unet", "special",
                skip_actions="free_requested", priority=3,
                note="recorded with skip_actions=['free_requested']"),
        RunSpec("special.fsdp", "fsdp", "special", priority=1,
                note="FSDP2 on a one-rank NCCL group (file:// rendezvous); skipped if it cannot start"),
    ]
    names = [r.name for r in runs]
    assert len(names) == len(set(names)), "run names must be unique"
    return runs
