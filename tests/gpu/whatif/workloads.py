"""The what-if harness's workloads: small, seeded PyTorch jobs whose memory behaves like real
training and inference (issue 16), plus the shapes of snapshot users bring (issue 17).

Each workload is a function `workload(job)` registered in WORKLOADS. It runs on `job.device`
(cuda:0 on the H200; the CPU for a shape check here, see cpu_check.py) and reports what it
caught through `job`: OOMs it survived (`job.caught_oom()`) and facts worth keeping in the run's
meta JSON (`job.notes`). A workload that cannot run on this machine (a process group that will
not start) raises WorkloadSkipped with the reason; any other exception is the run's failure.

Sizes are chosen so one run takes a few seconds on an H200, its trace stays well under 100k
events and its peak under a few GiB (eight runs share the GPU). Every workload draws its data
from a fixed seed and avoids kernels whose results depend on timing, so the request sequence
((action, size) of alloc/free_requested) is the same from run to run whatever the allocator
config; where autograd's free order still varies, compare.py reports the pair apart.
"""
import contextlib
import gc
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

MIB = 1 << 20


class WorkloadSkipped(Exception):
    """The workload cannot run on this machine (e.g. no process group); the message says why."""


class Job:
    """What a workload runs on and what it tells the harness.

    device: where tensors go. The CUDA-only parts (side streams, record_stream, pinned memory,
    CUDA graphs) become plain code on the CPU so the shapes and control flow can be checked
    without a GPU.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.caught_ooms = 0
        self.notes = {}
        # Objects the snapshot must find alive: a MemPool destroyed when the workload returns
        # would empty its cache (emptyCache(pool id)) before the snapshot is taken.
        self.kept = []

    def caught_oom(self, error):
        """Counts an OOM the workload survived and keeps the first line of its message."""
        self.caught_ooms += 1
        self.notes.setdefault("caught_oom_messages", []).append(str(error).splitlines()[0][:200])

    def stream(self):
        """A second CUDA stream (None on the CPU)."""
        return torch.cuda.Stream(self.device) if self.cuda else None

    def on_stream(self, stream):
        """`with job.on_stream(s):` runs the block on stream s (no-op on the CPU)."""
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def wait_stream(self, stream):
        """The current stream waits for work queued on `stream`."""
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)

    def record_stream(self, tensor):
        """Marks `tensor` (made on another stream) as used on the current stream, so its block
        is reused only after the current stream's queued work is done (a deferred free)."""
        if self.cuda:
            tensor.record_stream(torch.cuda.current_stream(self.device))

    def warm_up(self, step, times):
        """Runs `step()` `times` times on a new side stream that waits for the current one, and
        makes the current stream wait for it: the warm-up the CUDA-graphs guide asks for before
        a capture (plain calls on the CPU)."""
        side = self.stream()
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with self.on_stream(side):
            for _ in range(times):
                step()
        self.wait_stream(side)

    def pin(self, tensor):
        """Page-locked host memory on CUDA machines (for asynchronous copies)."""
        return tensor.pin_memory() if self.cuda else tensor

    def synchronize(self):
        """Waits for the device."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def empty_cache(self):
        """torch.cuda.empty_cache() on CUDA machines."""
        if self.cuda:
            torch.cuda.empty_cache()

    def compile(self, fn):
        """torch.compile(mode="reduce-overhead") on CUDA (CUDA graphs, private memory pools);
        on the CPU the eager backend, which still runs Dynamo's tracing over the same code."""
        if self.cuda:
            return torch.compile(fn, mode="reduce-overhead")
        return torch.compile(fn, backend="eager")


def seed_all(seed):
    """Seeds every generator a workload draws from and pins cuDNN to its heuristics (no
    benchmarking, whose choice of algorithm, and so of workspace size, depends on timing)."""
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False


# --- models -------------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block: self-attention (PyTorch's fused SDPA; causal unless
    told otherwise) and an MLP."""

    def __init__(self, d_model, heads, hidden, causal=True):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def split_heads(self, x):
        """(batch, seq, d_model) -> (batch, heads, seq, d_head)."""
        batch, seq, width = x.shape
        return x.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)

    def attend(self, q, k, v, causal):
        """Attention over the given keys and values, heads merged back."""
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        batch, _, seq, _ = out.shape
        return out.transpose(1, 2).reshape(batch, seq, -1)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(self.attend(self.split_heads(q), self.split_heads(k),
                                      self.split_heads(v), causal=self.causal))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    def decode(self, x, cache):
        """One generation step (or the prompt) with a KV cache that grows by concatenation:
        each step allocates the longer key and value tensors and frees the old ones, as
        Hugging Face's DynamicCache does. `cache` is [keys, values] or [None, None]."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        if cache[0] is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        cache[0], cache[1] = k, v
        x = x + self.proj(self.attend(q, k, v, causal=q.shape[2] > 1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class LanguageModel(nn.Module):
    """Token embedding, transformer blocks, a vocabulary head; optional activation
    checkpointing of every block (its activations recomputed in the backward pass)."""

    def __init__(self, vocab, d_model, heads, layers, checkpointed=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, 4 * d_model) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpointed = checkpointed

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            if self.checkpointed and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))

    def decode(self, tokens, caches):
        """Logits for `tokens` given the per-block caches (updated in place)."""
        x = self.embed(tokens)
        for block, cache in zip(self.blocks, caches):
            x = block.decode(x, cache)
        return self.head(self.norm(x))


def halving_on_oom(job, batch, run):
    """`run(batch)`'s result; after an OOM (caught and counted) `run` again at half the batch,
    down to 2 rows, where the OOM is raised: the retry evaluation and serving scripts use."""
    while True:
        try:
            return run(batch)
        except torch.OutOfMemoryError as error:
            job.caught_oom(error)
            if batch <= 2:
                raise
            batch //= 2


def learn(optimizer, loss):
    """One optimizer step from `loss`: backward, the update, the gradients dropped (set to
    None, so their blocks are freed before the next forward)."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def lm_step(model, optimizer, tokens):
    """One next-token training step; the logits and loss are dropped before returning."""
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    del logits
    learn(optimizer, loss)


def conv_bn_relu(cin, cout):
    """Two 3x3 convolutions with batch norm and ReLU: one U-Net stage."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A three-level U-Net: max-pool down, transposed-convolution up, skip connections
    concatenated (the activations of every level stay alive until the decoder uses them)."""

    def __init__(self, channels=(32, 64, 128, 256), cin=3, cout=3):
        super().__init__()
        self.down = nn.ModuleList()
        width = cin
        for c in channels[:-1]:
            self.down.append(conv_bn_relu(width, c))
            width = c
        self.bottom = conv_bn_relu(channels[-2], channels[-1])
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        for c in reversed(channels[:-1]):
            self.up.append(nn.ConvTranspose2d(c * 2, c, 2, stride=2))
            self.merge.append(conv_bn_relu(c * 2, c))
        self.out = nn.Conv2d(channels[0], cout, 1)

    def forward(self, x):
        skips = []
        for stage in self.down:
            x = stage(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.out(x)


class SmallConvNet(nn.Module):
    """A classifier for the prefetch loop: three conv stages and a linear head."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class ResidualMLP(nn.Module):
    """Residual MLP blocks (LayerNorm, Linear, GELU, Linear): small enough to compile fast."""

    def __init__(self, width=1024, hidden=4096, blocks=3):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                          nn.Linear(hidden, width))
            for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class MoELayer(nn.Module):
    """A top-2 mixture-of-experts feed-forward layer with token dispatch by sorting.

    Tokens are grouped by expert (a stable sort of the routing choices), each expert runs on
    its contiguous slice, and a gather puts the results back in token order. The slices have
    data-dependent sizes, so the allocations do too, as in real MoE training. The router is
    frozen so routing depends on the data alone; every gradient path avoids order-dependent
    atomic sums, so the routing, and so the request sequence, repeats from run to run.
    """

    def __init__(self, width, hidden, experts, top_k=2):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.router = nn.Linear(width, experts, bias=False)
        self.router.weight.requires_grad_(False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            for _ in range(experts))
        self.top_k = top_k

    def forward(self, x):
        tokens, width = x.shape
        h = self.norm(x)
        weights, chosen = self.router(h).softmax(-1).topk(self.top_k, dim=-1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        grouped = h[order // self.top_k]
        outputs = []
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                outputs.append(expert(grouped[start:start + count]))
                start += count
        back = torch.cat(outputs)[torch.argsort(order)]
        mixed = (back.view(tokens, self.top_k, width) * weights.unsqueeze(-1)).sum(1)
        return x + mixed


class VisionTransformer(nn.Module):
    """A ViT: 16 x 16 patches embedded by a strided convolution, a class token, learned
    positions, non-causal transformer blocks, a linear head on the class token."""

    def __init__(self, image=224, patch=16, d_model=384, heads=6, layers=6, classes=100):
        super().__init__()
        self.patch = nn.Conv2d(3, d_model, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos = nn.Parameter(torch.randn(1, tokens, d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads, 4 * d_model, causal=False)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class SwiGLU(nn.Module):
    """A pre-norm SwiGLU feed-forward block with a residual connection."""

    def __init__(self, width, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


# --- workloads ----------------------------------------------------------------------------


def transformer_ckpt(job):
    """Language-model training with activation checkpointing: 6 blocks (d_model 512), batch
    8 x 256 tokens, AdamW, 4 steps. Each block's activations are recomputed in the backward
    pass, so the trace has the forward twice and a lower, spikier peak."""
    seed_all(1)
    model = LanguageModel(8192, 512, 8, 6, checkpointed=True).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(4):
        tokens = torch.randint(0, 8192, (8, 257), device=job.device)
        lm_step(model, optimizer, tokens)
        del tokens
    job.synchronize()


def unet(job):
    """U-Net training (32..256 channels, 8 x 3 x 128 x 128 images, MSE to a target, Adam,
    4 steps): large convolution activations, cuDNN workspaces, skip tensors held across the
    network."""
    seed_all(2)
    model = UNet().to(job.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(4):
        images = torch.randn(8, 3, 128, 128, device=job.device)
        target = torch.randn(8, 3, 128, 128, device=job.device)
        loss = F.mse_loss(model(images), target)
        learn(optimizer, loss)
        del images, target, loss
    job.synchronize()


def kv_decoder(job):
    """Greedy generation with a growing KV cache, bfloat16, 2 blocks (d_model 512), batch 64:
    two requests (prompts of 24 and 100 tokens, 128 new tokens each) with empty_cache()
    between them, as a server might. The cache tensors are re-allocated at every step as they
    grow (64 KiB per token per tensor: 1.5 to 9.5 MiB in the first request, 6.3 to 14.3 MiB
    across the 10 MiB border in the second); the prompt's logits cover every position (a
    100 MiB spike in the second)."""
    seed_all(3)
    model = LanguageModel(8192, 512, 8, 2).to(job.device, torch.bfloat16).eval()
    with torch.no_grad():
        for prompt_length in (24, 100):
            caches = [[None, None] for _ in model.blocks]
            tokens = torch.randint(0, 8192, (64, prompt_length), device=job.device)
            logits = model.decode(tokens, caches)
            next_token = logits[:, -1].argmax(-1, keepdim=True)
            del logits, tokens
            for _ in range(128):
                logits = model.decode(next_token, caches)
                next_token = logits[:, -1].argmax(-1, keepdim=True)
                del logits
            job.notes.setdefault("final_cache_bytes", []).append(
                caches[0][0].numel() * caches[0][0].element_size())
            del caches, next_token
            job.empty_cache()
    job.synchronize()


def prefetch(job):
    """A training loop fed by a side stream: each batch is copied from pinned host memory and
    normalised on a second stream while the previous batch trains on the default stream, then
    handed over with wait_stream + record_stream. The batch's blocks belong to the side
    stream's pool and their frees are deferred until the default stream's work is done
    (free_requested and free_completed far apart). 16 pinned batches of 64 x 3 x 96 x 96, a
    small convnet, SGD, 40 steps."""
    seed_all(4)
    model = SmallConvNet().to(job.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(4)
    host_images = [job.pin(torch.randn(64, 3, 96, 96, generator=generator)) for _ in range(16)]
    host_labels = [job.pin(torch.randint(0, 10, (64,), generator=generator)) for _ in range(16)]
    copy_stream = job.stream()
    with job.on_stream(copy_stream):
        # Made and used on the side stream only, so its pool holds them.
        mean = torch.tensor([0.1, -0.2, 0.05], device=job.device).view(1, 3, 1, 1)
        std = torch.tensor([1.1, 0.9, 1.0], device=job.device).view(1, 3, 1, 1)

    def load(step):
        """Queues batch `step`'s copy and normalisation on the side stream."""
        with job.on_stream(copy_stream):
            images = host_images[step % 16].to(job.device, non_blocking=True)
            labels = host_labels[step % 16].to(job.device, non_blocking=True)
            images = (images - mean) / std
        return images, labels

    upcoming = load(0)
    for step in range(40):
        job.wait_stream(copy_stream)
        images, labels = upcoming
        job.record_stream(images)
        job.record_stream(labels)
        upcoming = load(step + 1)
        loss = F.cross_entropy(model(images), labels)
        learn(optimizer, loss)
        del images, labels, loss
    del upcoming
    job.synchronize()


def compiled(job):
    """torch.compile(mode="reduce-overhead") training of a residual MLP (3 blocks, width 1024,
    batch 64 x 128 rows): after warm-up, the forward and backward run as CUDA graphs whose
    memory lives in a private pool (segment_pool_id other than (0, 0)); the optimizer runs
    eagerly in the default pool. 12 steps."""
    seed_all(5)
    model = ResidualMLP().to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss_of(x, y):
        """The compiled part: forward and loss (its backward is compiled alongside)."""
        return F.mse_loss(model(x), y)

    step_fn = job.compile(loss_of)
    for _ in range(12):
        x = torch.randn(64, 128, 1024, device=job.device)
        y = torch.randn(64, 128, 1024, device=job.device)
        if job.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        loss = step_fn(x, y)
        learn(optimizer, loss)
        del x, y, loss
    job.synchronize()


def graphed_step(job, optimizer, step_fn, *inputs):
    """One training step through a reduce-overhead compiled loss: a new step for cudagraph
    trees (so the previous step's outputs may be overwritten), backward, the optimizer."""
    if job.cuda:
        torch.compiler.cudagraph_mark_step_begin()
    loss = step_fn(*inputs)
    learn(optimizer, loss)


def compiled_lm(job):
    """torch.compile(mode="reduce-overhead") of a small language model (2 blocks, width 256,
    vocabulary 4096): 6 training steps on 8 x 128 tokens (forward and backward graphs), then
    inference without gradients at two lengths, each recorded as a graph of its own. Every
    recording is a CUDA-graph capture in cudagraph trees' private pool, each begun by
    torch.cuda.graph's empty_cache()."""
    seed_all(8)
    model = LanguageModel(4096, 256, 4, 2).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss_of(tokens):
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    train_step = job.compile(loss_of)
    for _ in range(6):
        tokens = torch.randint(0, 4096, (8, 129), device=job.device)
        graphed_step(job, optimizer, train_step, tokens)
        del tokens
    model.eval()
    infer = job.compile(lambda tokens: model(tokens).argmax(-1))
    with torch.no_grad():
        for length in (64, 64, 96, 96, 64):
            tokens = torch.randint(0, 4096, (4, length), device=job.device)
            if job.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            out = infer(tokens).clone()
            del tokens, out
    job.synchronize()


def user_graphs(job):
    """CUDA graphs captured by hand, as the CUDA-graphs guide shows: a conv net's inference
    warmed up on a side stream, captured with torch.cuda.graph at batch 32, then at batch 64
    in the same pool, both replayed; then an MLP's training step through
    torch.cuda.make_graphed_callables. Each capture begins with torch.cuda.graph's
    empty_cache(); on the CPU the same calls run eagerly."""
    seed_all(9)
    model = SmallConvNet().to(job.device).eval()
    graphs, outputs, inputs = [], [], []
    pool = None
    with torch.no_grad():
        for batch in (32, 64):
            static_in = torch.randn(batch, 3, 64, 64, device=job.device)
            job.warm_up(lambda: model(static_in), 3)
            if job.cuda:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    static_out = model(static_in)
                pool = graph.pool()
                graphs.append(graph)
            else:
                static_out = model(static_in)
            inputs.append(static_in)
            outputs.append(static_out)
        for step in range(4):
            for index, static_in in enumerate(inputs):
                static_in.copy_(torch.randn_like(static_in))
                if job.cuda:
                    graphs[index].replay()
                else:
                    outputs[index] = model(static_in)
                prediction = outputs[index].argmax(-1).clone()
                del prediction
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).to(job.device)
    optimizer = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    sample = torch.randn(64, 512, device=job.device, requires_grad=True)
    if job.cuda:
        mlp = torch.cuda.make_graphed_callables(mlp, (sample,))
    for _ in range(4):
        x = torch.randn(64, 512, device=job.device)
        loss = mlp(x).square().mean()
        learn(optimizer, loss)
        del x, loss
    job.synchronize()


def mem_pools(job):
    """torch.cuda.MemPool with use_mem_pool (PyTorch 2.5+): a conv net's weights made in a pool
    of their own; staging buffers made on a side stream in a second pool, dropped midway and
    followed by empty_cache(), which leaves the pool in use its cached segment; 12 training
    steps in the default pools. Both pools live until the snapshot (job.kept): a pool
    destroyed earlier empties its own cache, which a 2.11 trace shows only by the segments it
    releases, with no pool named. On the CPU the same tensors without pools."""
    seed_all(10)
    weights_pool = torch.cuda.MemPool() if job.cuda else None
    with (torch.cuda.use_mem_pool(weights_pool) if job.cuda else contextlib.nullcontext()):
        model = SmallConvNet(100).to(job.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    side = job.stream()
    staging_pool = torch.cuda.MemPool() if job.cuda else None
    staged = []
    with job.on_stream(side):
        with (torch.cuda.use_mem_pool(staging_pool) if job.cuda else contextlib.nullcontext()):
            for index in range(6):
                staged.append(torch.randn(32 + 8 * index, 3, 64, 64, device=job.device))
    job.wait_stream(side)
    for step in range(12):
        if step == 6:
            staged.clear()
            job.empty_cache()
        images = staged[step % len(staged)] if staged else torch.randn(48, 3, 64, 64,
                                                                      device=job.device)
        labels = torch.randint(0, 100, (images.shape[0],), device=job.device)
        loss = F.cross_entropy(model(images), labels)
        learn(optimizer, loss)
        del images, labels, loss
    job.kept += [weights_pool, staging_pool, model, optimizer]
    job.synchronize()


def compiled_shapes(job):
    """torch.compile(mode="reduce-overhead", dynamic=False) of a residual MLP (width 512) run at
    batch sizes 16, 32, 16, 48, 32, 48, 16 with training steps between: each new size is
    compiled and recorded as a graph of its own in cudagraph trees' one pool, and going back to
    a size replays its graph (checkpoint restores when a new recording follows replays)."""
    seed_all(11)
    model = ResidualMLP(width=512, hidden=2048, blocks=2).to(job.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if job.cuda:
        step_fn = torch.compile(lambda x: model(x).square().mean(), mode="reduce-overhead",
                                dynamic=False)
    else:
        step_fn = torch.compile(lambda x: model(x).square().mean(), backend="eager",
                                dynamic=False)
    for batch in (16, 32, 16, 48, 32, 48, 16):
        for _ in range(2):
            x = torch.randn(batch, 64, 512, device=job.device)
            graphed_step(job, optimizer, step_fn, x)
            del x
    job.synchronize()


def two_streams(job):
    """Two side streams around a conv net's training: one copies the next batch in
    (record_stream on the default stream); the other computes an auxiliary head on the
    features, handed over with wait_stream and record_stream, and the features die on the
    default stream while that work may still run. 16 steps."""
    seed_all(12)
    model = SmallConvNet(10).to(job.device)
    aux_head = nn.Linear(128, 10).to(job.device)
    params = list(model.parameters()) + list(aux_head.parameters())
    optimizer = torch.optim.SGD(params, lr=1e-2)
    copy_stream, aux_stream = job.stream(), job.stream()
    host = [job.pin(torch.randn(64, 3, 64, 64)) for _ in range(4)]

    def load(step):
        with job.on_stream(copy_stream):
            return host[step % 4].to(job.device, non_blocking=True)

    upcoming = load(0)
    for step in range(16):
        job.wait_stream(copy_stream)
        images = upcoming
        job.record_stream(images)
        upcoming = load(step + 1)
        features = torch.flatten(model.features(images), 1)
        if aux_stream is not None:
            aux_stream.wait_stream(torch.cuda.current_stream(job.device))
        with job.on_stream(aux_stream):
            if aux_stream is not None:
                features.record_stream(aux_stream)
            aux = aux_head(features).square().mean()
        job.wait_stream(aux_stream)
        loss = model.head(features).square().mean() + aux
        learn(optimizer, loss)
        del images, features, aux, loss
    del upcoming
    job.synchronize()


def moe(job):
    """Mixture-of-experts training: 2 top-2 MoE layers of 8 experts (width 512, hidden 1024)
    over 8 x 256 tokens, Adam, 4 steps. The experts' slices have data-dependent sizes."""
    seed_all(6)
    layers = nn.Sequential(MoELayer(512, 1024, 8), MoELayer(512, 1024, 8)).to(job.device)
    optimizer = torch.optim.Adam([p for p in layers.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(4):
        x = torch.randn(8 * 256, 512, device=job.device)
        target = torch.randn(8 * 256, 512, device=job.device)
        loss = F.mse_loss(layers(x), target)
        learn(optimizer, loss)
        del x, target, loss
    job.synchronize()


def search_batch_size(runs, start, max_trials):
    """The batch-size finder of training frameworks: double the batch until a step fails,
    then bisect between the largest size that ran and the smallest that failed.

    runs(size) -> bool says whether one step at that size ran. Returns (largest size that
    ran, or 0, [(size, ran), ...] in trial order). Stops when the bounds are adjacent or after
    max_trials steps.
    """
    trials = []
    ran, failed = 0, None
    size = start
    while len(trials) < max_trials:
        ok = runs(size)
        trials.append((size, ok))
        if ok:
            ran = size
        else:
            failed = size
        if failed is None:
            size *= 2
            continue
        if failed - ran <= 1:
            break
        size = (ran + failed) // 2
    return ran, trials


def bs_search(job):
    """A batch-size search that catches OOMs, run under a per-process memory fraction (the
    run's --limit-bytes; a fraction is not written into the snapshot): a 3-block language model
    (d_model 512, 256 tokens) tries one AdamW step per batch size, doubling from 4 until it
    runs out of memory, then bisecting. Each OOM is caught, the step's tensors dropped,
    gc.collect() and empty_cache() called (as frameworks do), and the search goes on. Then 2
    training steps at the size found."""
    seed_all(7)
    model = LanguageModel(8192, 512, 8, 3).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def runs(size):
        """One training step at batch `size`; False when it ran out of memory."""
        try:
            tokens = torch.randint(0, 8192, (size, 257), device=job.device)
            lm_step(model, optimizer, tokens)
            return True
        except torch.OutOfMemoryError as error:
            job.caught_oom(error)
            optimizer.zero_grad(set_to_none=True)
            return False
        finally:
            gc.collect()
            job.empty_cache()

    found, trials = search_batch_size(runs, start=4, max_trials=12 if job.cuda else 3)
    job.notes["batch_size_trials"] = trials
    job.notes["batch_size_found"] = found
    if found == 0:
        raise RuntimeError("no batch size fits under the limit (bs_search needs a larger --limit-bytes)")
    for _ in range(2):
        lm_step(model, optimizer, torch.randint(0, 8192, (found, 257), device=job.device))
    job.synchronize()


def mlp(job):
    """Eager training of the residual MLP (width 1024, batch 16 x 128 rows, AdamW, 3 steps):
    few allocations, for recordings whose per-event cost is high (C++ stacks)."""
    seed_all(8)
    model = ResidualMLP().to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(3):
        x = torch.randn(16, 128, 1024, device=job.device)
        loss = F.mse_loss(model(x), x)
        learn(optimizer, loss)
        del x, loss
    job.synchronize()


def fsdp(job):
    """FSDP2 (fully_shard) training of a 4-block language model on a one-rank process group
    (NCCL on the GPU, gloo on the CPU; the rendezvous is a file, so no network), AdamW, 3
    steps: parameters all-gathered and gradients reduce-scattered through FSDP's own streams.
    Skipped, with the reason, when the process group or FSDP cannot start here."""
    import torch.distributed as dist
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as error:
        raise WorkloadSkipped(f"torch.distributed.fsdp.fully_shard is not available: {error}")
    if not dist.is_available():
        raise WorkloadSkipped("torch.distributed is not available in this build")
    backend = "nccl" if job.cuda else "gloo"
    if job.cuda:
        # One rank needs no network; loopback is always there for NCCL's bootstrap socket.
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    rendezvous = tempfile.NamedTemporaryFile(prefix="whatif-fsdp-", delete=False)
    rendezvous.close()
    os.unlink(rendezvous.name)
    try:
        dist.init_process_group(backend, init_method=f"file://{rendezvous.name}", world_size=1,
                                rank=0, device_id=job.device if job.cuda else None)
    except Exception as error:  # noqa: BLE001 - any failure to start means "cannot run here"
        raise WorkloadSkipped(f"a one-rank {backend} process group did not start: "
                              f"{type(error).__name__}: {error}")
    try:
        seed_all(9)
        model = LanguageModel(8192, 512, 8, 4).to(job.device)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):
            lm_step(model, optimizer, torch.randint(0, 8192, (8, 257), device=job.device))
        job.notes["process_group"] = backend
        job.synchronize()
    finally:
        dist.destroy_process_group()
        if os.path.exists(rendezvous.name):
            os.unlink(rendezvous.name)


# --- second-wave workloads (issue 16: held-back workloads check the same two things) ------


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, a projection shortcut when
    the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: a 7x7 stem, four stages of two basic blocks (64..512 channels)."""

    def __init__(self, classes=100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages = []
        width = 64
        for c, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages += [BasicBlock(width, c, stride), BasicBlock(c, c, 1)]
            width = c
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet(job):
    """ResNet training in channels_last (batch 32 x 3 x 160 x 160, SGD with momentum, 3 steps),
    then an evaluation pass under no_grad at batch 96: the training blocks are cached when the
    larger inference activations arrive, as in a train-then-validate loop."""
    seed_all(9)
    model = ResNet().to(job.device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        images = torch.randn(32, 3, 160, 160, device=job.device).to(
            memory_format=torch.channels_last)
        labels = torch.randint(0, 100, (32,), device=job.device)
        loss = F.cross_entropy(model(images), labels)
        learn(optimizer, loss)
        del images, labels, loss
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            images = torch.randn(96, 3, 160, 160, device=job.device).to(
                memory_format=torch.channels_last)
            predictions = model(images).argmax(-1)
            del images, predictions
    job.synchronize()


def amp_lm(job):
    """Mixed-precision language-model training: autocast to float16 (no cast cache) with a
    GradScaler, two micro-batches accumulated per optimizer step, and a sequence length that
    changes from step to step (96, 224, 160, 256 tokens; batch 6), so the activations come in
    many sizes. 4 blocks (d_model 384), vocabulary 12000, AdamW."""
    seed_all(10)
    model = LanguageModel(12000, 384, 6, 4).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=job.cuda)
    autocast_type = "cuda" if job.cuda else "cpu"
    amp_dtype = torch.float16 if job.cuda else torch.bfloat16
    for length in (96, 224, 160, 256):
        for _ in range(2):
            tokens = torch.randint(0, 12000, (6, length + 1), device=job.device)
            # Without autocast's cache of cast weights: it is freed at the context's exit in
            # hash-table order (by address), which changes the request sequence from run to run.
            with torch.autocast(autocast_type, dtype=amp_dtype, cache_enabled=False):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                       tokens[:, 1:].reshape(-1)) / 2
            del logits
            scaler.scale(loss).backward()
            del tokens, loss
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    job.synchronize()


def lstm(job):
    """A two-layer LSTM tagger (embedding 256, hidden 512) trained on padded batches whose
    length changes every step (batch 48; 80, 140, 60, 200, 120 steps): cuDNN's RNN workspace
    and reserve space are sized by the sequence length. Adam, gradient clipping."""
    seed_all(11)
    embed = nn.Embedding(5000, 256).to(job.device)
    rnn = nn.LSTM(256, 512, num_layers=2, batch_first=True).to(job.device)
    head = nn.Linear(512, 40).to(job.device)
    parameters = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-3)
    for length in (80, 140, 60, 200, 120):
        tokens = torch.randint(0, 5000, (48, length), device=job.device)
        tags = torch.randint(0, 40, (48, length), device=job.device)
        hidden, _ = rnn(embed(tokens))
        loss = F.cross_entropy(head(hidden).reshape(-1, 40), tags.reshape(-1))
        del hidden
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del tokens, tags, loss
    job.synchronize()


def serve(job):
    """Batched inference of a transformer encoder (nn.TransformerEncoder, 4 layers, d_model
    512, float16) over a queue of requests whose batch and length vary (1 x 512 up to 48 x
    384 tokens), never emptying the cache: each new shape is served from blocks cached for
    the ones before, split and merged, as in a serving process."""
    seed_all(12)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    model = model.to(job.device, torch.float16 if job.cuda else torch.float32).eval()
    dtype = torch.float16 if job.cuda else torch.float32
    requests = [(1, 512), (8, 128), (32, 64), (4, 384), (48, 384), (16, 256), (2, 96),
                (24, 320), (48, 128), (12, 512), (40, 200), (6, 448)]
    with torch.inference_mode():
        for batch, length in requests:
            x = torch.randn(batch, length, 512, device=job.device, dtype=dtype)
            pooled = model(x).mean(1)
            del x, pooled
    job.synchronize()


# A third wave, written after the replay's placement model was fitted to the first two, to
# check it on workloads it was not fitted to: a vision transformer with gradient clipping and
# an evaluation pass, activations offloaded to pinned host memory on a side stream, and packed
# batches whose token count changes every step.


def vit(job):
    """Vision-transformer training under bfloat16 autocast (batch 48 x 3 x 224 x 224, 6 blocks
    of width 384, AdamW, gradient clipping, 4 steps), then inference at batch 128: clipping's
    per-parameter norms add many small blocks between the large activations."""
    seed_all(13)
    model = VisionTransformer().to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast_type = "cuda" if job.cuda else "cpu"
    for _ in range(4):
        images = torch.randn(48, 3, 224, 224, device=job.device)
        labels = torch.randint(0, 100, (48,), device=job.device)
        with torch.autocast(autocast_type, dtype=torch.bfloat16, cache_enabled=False):
            loss = F.cross_entropy(model(images).float(), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del images, labels, loss
    model.eval()
    with torch.inference_mode(), torch.autocast(autocast_type, dtype=torch.bfloat16,
                                                cache_enabled=False):
        for _ in range(2):
            images = torch.randn(128, 3, 224, 224, device=job.device)
            predictions = model(images).argmax(-1)
            del images, predictions
    job.synchronize()


class SideStreamOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved activations of 1 MiB or more go to pinned host memory through a side stream and
    come back through it for the backward pass, as activation-offloading libraries do. The
    device copy's block is marked as used on the side stream (record_stream), so its free
    waits for the copy; the block brought back is made on the side stream and marked as used
    on the default stream. On the CPU the tensors are kept as they are."""

    def __init__(self, job, stream):
        def pack(tensor):
            if (not job.cuda or tensor.device.type != "cuda"
                    or (tensor.is_leaf and tensor.requires_grad)
                    or tensor.numel() * tensor.element_size() < MIB):
                return tensor
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            stream.wait_stream(torch.cuda.current_stream(job.device))
            with torch.cuda.stream(stream):
                host.copy_(tensor, non_blocking=True)
            tensor.record_stream(stream)
            return host

        def unpack(saved):
            if saved.device.type == "cuda" or not job.cuda:
                return saved
            with torch.cuda.stream(stream):
                tensor = saved.to(job.device, non_blocking=True)
            torch.cuda.current_stream(job.device).wait_stream(stream)
            tensor.record_stream(torch.cuda.current_stream(job.device))
            return tensor

        super().__init__(pack, unpack)


def offload(job):
    """Language-model training (4 blocks, d_model 512, batch 16 x 256 tokens, AdamW, 4 steps)
    with its saved activations offloaded to pinned host memory on a side stream
    (SideStreamOffload): deferred frees on both streams, and blocks of the side stream's pool
    freed on the default stream."""
    seed_all(14)
    model = LanguageModel(8000, 512, 8, 4).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    copy_stream = job.stream()
    for _ in range(4):
        tokens = torch.randint(0, 8000, (16, 257), device=job.device)
        with SideStreamOffload(job, copy_stream):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   tokens[:, 1:].reshape(-1))
            del logits
        learn(optimizer, loss)
        del tokens, loss
    job.synchronize()


def varlen(job):
    """Packed-sequence training of a SwiGLU stack (4 blocks, width 1024, hidden 2816, a
    vocabulary-8192 head, AdamW, 10 steps) on batches whose token count is drawn anew every
    step (1024 to 12288 tokens), so the large activations and logits never repeat a size."""
    seed_all(15)
    generator = torch.Generator().manual_seed(15)
    embed = nn.Embedding(8192, 1024).to(job.device)
    blocks = nn.Sequential(*(SwiGLU(1024, 2816) for _ in range(4))).to(job.device)
    head = nn.Linear(1024, 8192, bias=False).to(job.device)
    parameters = [*embed.parameters(), *blocks.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    for _ in range(10):
        count = int(torch.randint(1024, 12289, (1,), generator=generator))
        tokens = torch.randint(0, 8192, (count + 1,), device=job.device)
        logits = head(blocks(embed(tokens[:-1])))
        loss = F.cross_entropy(logits, tokens[1:])
        del logits
        learn(optimizer, loss)
        del tokens, loss
    job.synchronize()


# A fourth wave, also written after the model, for the hardest places: CUDA graphs
# sharing a pool beside a MemPool and eager work, gradient buckets made on a side stream, and a
# large-vocabulary loss computed in chunks of hundreds of MiB.


def graph_decode(job):
    """Generation whose decode step is a CUDA graph per batch size (8 and 16, sharing one
    pool), writing into per-batch caches made in a MemPool; each request's prompt runs eagerly
    in the default pools between the replays (6 requests, prompts of 64 to 224 tokens, 16
    decode steps each). A SwiGLU stack of width 512 and a 4000-word head. On the CPU the same
    steps run eagerly."""
    seed_all(16)
    width = 512
    layers = nn.Sequential(*(SwiGLU(width, 1408) for _ in range(3))).to(job.device).eval()
    head = nn.Linear(width, 4000, bias=False).to(job.device).eval()
    cache_pool = torch.cuda.MemPool() if job.cuda else None
    with (torch.cuda.use_mem_pool(cache_pool) if job.cuda else contextlib.nullcontext()):
        caches = {batch: torch.zeros(batch, 256, width, device=job.device) for batch in (8, 16)}
    graphs, statics = {}, {}
    # The pools live until the snapshot, even when an OOM ends the job: a MemPool that dies
    # runs emptyCache on its pool, a synchronisation the trace shows nothing of when nothing
    # is released (docs/snapshots.md, what a trace cannot show).
    job.kept += [cache_pool, caches, graphs]

    def step(x, cache, position):
        h = layers(x)
        cache.index_copy_(1, position, h.unsqueeze(1))
        return head(h + cache.mean(1))

    graph_pool = None
    with torch.no_grad():
        for batch in (8, 16):
            static_x = torch.randn(batch, width, device=job.device)
            position = torch.zeros(1, dtype=torch.long, device=job.device)
            job.warm_up(lambda: step(static_x, caches[batch], position), 3)
            if job.cuda:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=graph_pool):
                    static_out = step(static_x, caches[batch], position)
                graph_pool = graph.pool()
                graphs[batch] = graph
            else:
                static_out = None
            statics[batch] = (static_x, position, static_out)
        for request in range(6):
            batch = (8, 16)[request % 2]
            static_x, position, static_out = statics[batch]
            prompt = torch.randn(batch, 64 + 32 * request, width, device=job.device)
            summary = layers(prompt).mean(1)
            del prompt
            static_x.copy_(summary)
            del summary
            for t in range(16):
                position.fill_(t)
                if job.cuda:
                    graphs[batch].replay()
                    logits = static_out
                else:
                    logits = step(static_x, caches[batch], position)
                token = logits.argmax(-1)
                static_x.copy_(head.weight[token])
                del token, logits
    job.synchronize()


def buckets(job):
    """Training whose gradients are reduced in buckets on a side stream, as DDP does without
    a process group: after the backward pass the gradients are grouped, last layer first, into
    buckets of about 25 MiB; each bucket is flattened and scaled on the side stream (the
    gradients marked as used there), copied back after a wait_stream, and the flat buffer,
    made in the side stream's pool, is freed on the default stream (record_stream). A residual
    MLP of 4 blocks (width 1024, hidden 4096), batch 32 x 128 rows, AdamW, 6 steps."""
    seed_all(17)
    model = ResidualMLP(width=1024, hidden=4096, blocks=4).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    comm = job.stream()
    groups, group, size = [], [], 0
    for parameter in reversed(list(model.parameters())):
        group.append(parameter)
        size += parameter.numel() * parameter.element_size()
        if size >= 25 * MIB:
            groups.append(group)
            group, size = [], 0
    if group:
        groups.append(group)
    for _ in range(6):
        x = torch.randn(32, 128, 1024, device=job.device)
        loss = F.mse_loss(model(x), x)
        loss.backward()
        del x, loss
        for group in groups:
            grads = [parameter.grad for parameter in group]
            if comm is not None:
                comm.wait_stream(torch.cuda.current_stream(job.device))
            with job.on_stream(comm):
                flat = torch.cat([grad.reshape(-1) for grad in grads])
                flat.mul_(0.5)
            if comm is not None:
                for grad in grads:
                    grad.record_stream(comm)
            job.wait_stream(comm)
            job.record_stream(flat)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
            del flat, grads
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    job.synchronize()


def chunked_ce(job):
    """A large-vocabulary loss computed in chunks: the hidden states of 6144 tokens (a 2-block
    SwiGLU stack of width 1024) go through a 32000-word head 1536 tokens at a time, each
    chunk's logits (about 190 MiB) and their gradient made and freed in turn, the gradients
    gathered on a detached copy of the hidden states and passed back through the body. SGD,
    5 steps, the token count changing by 512 each step."""
    seed_all(18)
    body = nn.Sequential(nn.Embedding(32000, 1024),
                         *(SwiGLU(1024, 2816) for _ in range(2))).to(job.device)
    head = nn.Linear(1024, 32000, bias=False).to(job.device)
    parameters = [*body.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=1e-3)
    for index in range(5):
        count = 6144 - 512 * index
        tokens = torch.randint(0, 32000, (count + 1,), device=job.device)
        hidden = body(tokens[:-1])
        detached = hidden.detach().requires_grad_()
        for start in range(0, count, 1536):
            logits = head(detached[start:start + 1536])
            loss = F.cross_entropy(logits, tokens[1 + start:1 + start + 1536]) * (
                logits.shape[0] / count)
            del logits
            loss.backward()
            del loss
        hidden.backward(detached.grad)
        del tokens, hidden, detached
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    job.synchronize()


def graph_evict(job):
    """An inference server that evicts a CUDA graph to make room, and a MemPool that dies
    midway: a SwiGLU stack (width 768, 2 blocks, a 1000-way head) captured for batches of 8,
    16 and 32 rows of 128 tokens, each graph in a private pool of its own, and replayed; the
    batch-32 graph is then deleted with its static tensors (its pool becomes freeable: the
    OOM path's `release_cached_blocks` or an `empty_cache()` releases its cached segments),
    and 3 AdamW training steps at batch 24 x 256 follow in the default pools; then a
    temporary MemPool holds a phase's scratch buffers and is destroyed once they are freed
    (its `emptyCache(pool)` releases its segments), `empty_cache()` is called, and a batch-64
    graph is captured into a new pool and replayed. On the CPU the same steps run eagerly."""
    seed_all(19)
    width = 768
    model = nn.Sequential(SwiGLU(width, 2048), SwiGLU(width, 2048),
                          nn.Linear(width, 1000)).to(job.device)
    graphs = {}
    # The graphs kept at the end live until the snapshot (job.kept); the evicted one and the
    # scratch pool die midway on purpose.
    job.kept.append(graphs)

    def capture(batch):
        static_x = torch.randn(batch, 128, width, device=job.device)
        with torch.no_grad():
            job.warm_up(lambda: model(static_x), 2)
            if job.cuda:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = model(static_x)
            else:
                graph, static_out = None, model(static_x)
        graphs[batch] = (graph, static_x, static_out)

    def serve(rounds):
        for _ in range(rounds):
            for batch, (graph, static_x, static_out) in list(graphs.items()):
                static_x.copy_(torch.randn_like(static_x))
                if graph is not None:
                    graph.replay()
                else:
                    with torch.no_grad():
                        graphs[batch] = (None, static_x, model(static_x))
                prediction = graphs[batch][2].argmax(-1)
                del prediction

    for batch in (8, 16, 32):
        capture(batch)
    serve(3)
    del graphs[32]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(3):
        x = torch.randn(24, 256, width, device=job.device)
        loss = model(x).square().mean()
        learn(optimizer, loss)
        del x, loss
    scratch_pool = torch.cuda.MemPool() if job.cuda else None
    with (torch.cuda.use_mem_pool(scratch_pool) if job.cuda else contextlib.nullcontext()):
        scratch = [torch.empty(size << 20, dtype=torch.uint8, device=job.device)
                   for size in (6, 18, 40)]
    for buffer in scratch:
        buffer.fill_(1)
    del scratch, buffer
    del scratch_pool
    job.empty_cache()
    capture(64)
    serve(2)
    job.synchronize()


def pool_phases(job):
    """Evaluations whose activations go to a MemPool that is emptied and filled again between
    training steps, then destroyed with no empty_cache() after it: the residual MLP (width
    1024) trained at batch 24 x 128 rows in the default pools (AdamW); after every other step
    an evaluation at batch 48 x 128 under use_mem_pool, its predictions kept until the next
    one; after 6 steps the predictions are dropped and the pool destroyed (its
    emptyCache(pool) releases its segments alone), then 3 more steps. On the CPU the same
    tensors without a pool."""
    seed_all(20)
    model = ResidualMLP().to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    eval_pool = torch.cuda.MemPool() if job.cuda else None

    def train_step():
        x = torch.randn(24, 128, 1024, device=job.device)
        loss = F.mse_loss(model(x), x)
        learn(optimizer, loss)
        del x, loss

    predictions = None
    for step in range(6):
        train_step()
        if step % 2 == 1:
            predictions = None
            with torch.no_grad(), (torch.cuda.use_mem_pool(eval_pool) if job.cuda
                                   else contextlib.nullcontext()):
                batch = torch.randn(48, 128, 1024, device=job.device)
                predictions = model(batch).argmax(-1)
                del batch
    del predictions
    del eval_pool
    for _ in range(3):
        train_step()
    job.synchronize()


def pool_cache(job):
    """Two MemPools beside training, written after the replay learnt to infer MemPools gone by
    the end, to check it where it was not fitted: a SwiGLU stack (width 640, 3 blocks)
    trained at batch 16 x 192 rows (AdamW); every other step features of a batch 32 x 192 are
    computed under use_mem_pool into a long-lived feature pool and kept, at most two at a
    time (the oldest dropped, its blocks reused); every third step a fresh scratch MemPool
    holds buffers of 10, 30 and 70 MiB, freed and the pool destroyed at once (its
    emptyCache(pool) releases them). After 7 steps the features and the feature pool go,
    and 2 more steps run. On the CPU the same tensors without pools."""
    seed_all(21)
    width = 640
    model = nn.Sequential(SwiGLU(width, 1792), SwiGLU(width, 1792),
                          SwiGLU(width, 1792)).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    feature_pool = torch.cuda.MemPool() if job.cuda else None

    def in_pool(pool):
        return torch.cuda.use_mem_pool(pool) if job.cuda else contextlib.nullcontext()

    def train_step():
        x = torch.randn(16, 192, width, device=job.device)
        loss = model(x).square().mean()
        learn(optimizer, loss)
        del x, loss

    features = []
    for step in range(7):
        train_step()
        if step % 2 == 1:
            with torch.no_grad(), in_pool(feature_pool):
                batch = torch.randn(32, 192, width, device=job.device)
                features.append(model(batch).mean(-1))
                del batch
            if len(features) > 2:
                features.pop(0)
        if step % 3 == 2:
            scratch_pool = torch.cuda.MemPool() if job.cuda else None
            with in_pool(scratch_pool):
                scratch = [torch.empty(size << 20, dtype=torch.uint8, device=job.device)
                           for size in (10, 30, 70)]
            for buffer in scratch:
                buffer.fill_(step)
            del scratch, buffer
            del scratch_pool
    del features
    del feature_pool
    for _ in range(2):
        train_step()
    job.synchronize()


def pool_retry(job):
    """Inference at the largest batch that fits, found in a MemPool, written after the replay
    learnt to infer MemPools to check it where it was not fitted: a SwiGLU stack (width 512,
    2 blocks) trained at batch 8 x 256 rows (AdamW); then, under use_mem_pool, batches of 96,
    64, 48, 32 and 16 x 256 rows tried from the largest down, each OOM caught and the try's
    tensors dropped, the first that fits kept; 2 more training steps; the pool destroyed with
    the kept output, then 2 more steps. On the CPU the same tensors without a pool (the first
    batch fits)."""
    seed_all(22)
    width = 512
    model = nn.Sequential(SwiGLU(width, 1536), SwiGLU(width, 1536)).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pool = torch.cuda.MemPool() if job.cuda else None

    def train_step():
        x = torch.randn(8, 256, width, device=job.device)
        loss = model(x).square().mean()
        learn(optimizer, loss)
        del x, loss

    for _ in range(3):
        train_step()
    kept = None
    for batch in (96, 64, 48, 32, 16):
        try:
            with torch.no_grad(), (torch.cuda.use_mem_pool(pool) if job.cuda
                                   else contextlib.nullcontext()):
                x = torch.randn(batch, 256, width, device=job.device)
                kept = model(x).softmax(-1)
                del x
            break
        except torch.OutOfMemoryError as error:
            job.caught_oom(error)
            kept = None
    for _ in range(2):
        train_step()
    del kept, pool
    for _ in range(2):
        train_step()
    job.synchronize()



def pool_side(job):
    """A MemPool fed from a side stream, written after the eighth wave's fixes to check them
    where they were not fitted: a SwiGLU stack (width 576, 2 blocks) trained at batch 12 x 224
    rows (AdamW) on the default stream, each step's next batch made on a side stream inside
    use_mem_pool of a prefetch pool (randn and a normalisation, two temporaries) and recorded
    on the default stream (record_stream: its free waits for the step's work); every third
    step the next batch goes to a fresh prefetch pool and the old one is destroyed while its
    last batch's free is still deferred. Then an evaluation inside an eval MemPool (kept to
    the end) at 64, 40 and 24 x 224 rows from the largest down, each OOM caught and the try's
    tensors dropped, and 2 more training steps. On the CPU the same tensors without pools or
    streams."""
    seed_all(23)
    width = 576
    model = nn.Sequential(SwiGLU(width, 1664), SwiGLU(width, 1664)).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = job.stream()

    def in_pool(pool):
        return torch.cuda.use_mem_pool(pool) if job.cuda else contextlib.nullcontext()

    def new_pool():
        return torch.cuda.MemPool() if job.cuda else None

    def prepare(pool, rows):
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(job.device))
        with job.on_stream(side), in_pool(pool):
            raw = torch.randn(rows, 224, width, device=job.device)
            centred = raw - raw.mean(-1, keepdim=True)
            batch = centred / (centred.std(-1, keepdim=True) + 1e-5)
            del raw, centred
        job.wait_stream(side)
        job.record_stream(batch)
        return batch

    def train_on(batch):
        loss = model(batch).square().mean()
        learn(optimizer, loss)
        del loss

    pool = new_pool()
    batch = prepare(pool, 12)
    for step in range(8):
        old_pool = None
        if step % 3 == 2:
            old_pool, pool = pool, new_pool()
        following = prepare(pool, 12)
        train_on(batch)
        batch = following
        del following
        if old_pool is not None:
            del old_pool
    del batch
    eval_pool = new_pool()
    job.kept.append(eval_pool)

    def evaluate(rows):
        with torch.no_grad(), in_pool(eval_pool):
            x = torch.randn(rows, 224, width, device=job.device)
            return model(x).softmax(-1)

    kept = None
    for rows in (64, 40, 24):
        try:
            kept = evaluate(rows)
            break
        except torch.OutOfMemoryError as error:
            job.caught_oom(error)
    for _ in range(2):
        batch = prepare(pool, 12)
        train_on(batch)
        del batch
    del kept
    job.synchronize()


# A tenth wave (results-wave10/), written after the ninth wave's fixes and not fitted to: the
# default pools again, under the patterns of serving and fine-tuning scripts.


def pipeline(job):
    """Batched inference on three streams, as a serving process overlaps copies with compute:
    each request's rows are uploaded from pinned host memory on an upload stream and projected
    there by a matmul (cuBLAS's workspace for that stream), handed to the default stream
    (record_stream: the free waits for the default stream's work), run through an MLP (width
    1536, hidden 4096), and copied back to pinned host memory on a download stream (record_stream
    again). The batch changes every request (64 to 1024 rows, seeded); the download stream is
    waited for every 8 requests and the cache emptied every 20. At request 24 the model is
    swapped for a wider one (hidden 6144), loaded while the old one is still referenced.
    48 requests."""
    seed_all(31)
    generator = torch.Generator().manual_seed(31)
    rows = [64 * int(r) for r in torch.randint(1, 17, (48,), generator=generator)]
    width = 1536

    def make_model(hidden):
        return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width),
                             nn.GELU(), nn.Linear(width, hidden), nn.GELU(),
                             nn.Linear(hidden, width)).to(job.device).eval()

    model = make_model(4096)
    projection = torch.randn(width, width, device=job.device) / width ** 0.5
    host_in = job.pin(torch.randn(1024, width, generator=generator))
    host_out = job.pin(torch.empty(1024, width))
    upload, download = job.stream(), job.stream()
    if upload is not None:
        # The projection was made on the default stream.
        upload.wait_stream(torch.cuda.current_stream(job.device))
    with torch.no_grad():
        for request, n in enumerate(rows):
            if request == 24:
                wider = make_model(6144)
                model = wider
                del wider
            with job.on_stream(upload):
                x = host_in[:n].to(job.device, non_blocking=True)
                x = x @ projection
            job.wait_stream(upload)
            job.record_stream(x)
            y = model(x)
            del x
            if download is not None:
                download.wait_stream(torch.cuda.current_stream(job.device))
            with job.on_stream(download):
                host_out[:n].copy_(y, non_blocking=True)
                job.record_stream(y)
            del y
            if request % 8 == 7 and download is not None:
                download.synchronize()
            if request % 20 == 19:
                job.empty_cache()
    job.synchronize()


def finetune(job):
    """Fine-tuning as scripts written from the usual recipes do it: a language model (4 blocks,
    d_model 512, vocabulary 16000) trained with AdamW, three micro-batches of 6 rows accumulated
    per step at a length drawn per step (64 to 320 tokens, seeded), gradients clipped, and
    after every third step an evaluation under no_grad at 16 x 288 tokens followed by
    torch.cuda.empty_cache(); an evaluation that runs out of memory is caught and retried at
    half the batch, down to 2 rows. After step 4 the weights and the optimizer's state are
    cloned on the device as a checkpoint, dropped after step 6. 9 steps."""
    seed_all(32)
    generator = torch.Generator().manual_seed(32)
    vocab = 16000
    model = LanguageModel(vocab, 512, 8, 4).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    lengths = [32 * int(r) for r in torch.randint(2, 11, (9,), generator=generator)]

    def loss_of(tokens):
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    def evaluate(batch):
        model.eval()
        with torch.no_grad():
            tokens = torch.randint(0, vocab, (batch, 289), device=job.device)
            return loss_of(tokens).item()

    checkpoint_copy = None
    for step, length in enumerate(lengths):
        model.train()
        for _ in range(3):
            tokens = torch.randint(0, vocab, (6, length + 1), device=job.device)
            loss = loss_of(tokens) / 3
            loss.backward()
            del tokens, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 4:
            checkpoint_copy = ([p.detach().clone() for p in model.parameters()],
                               [t.clone() for state in optimizer.state.values()
                                for t in state.values() if torch.is_tensor(t)])
        if step == 6:
            checkpoint_copy = None
        if step % 3 == 2:
            job.notes.setdefault("eval_loss", []).append(halving_on_oom(job, 16, evaluate))
            job.empty_cache()
    del checkpoint_copy
    job.synchronize()


# --- the eleventh wave (results-wave11/): written after the tenth session's work, not fitted to:
# a run resumed from a checkpoint then served in float16, and video clips of a new size every
# step, whose buffers lie beyond any max_split_size_mb; both also run under the configs of
# EXTRA_CONFIGS in plan.py (max_non_split_rounding_mb, expandable segments with a split limit
# or a collection threshold, roundup_power2_divisions:8), which no earlier wave used.


def resume(job):
    """A run resumed from a checkpoint, as training scripts do it: a language model (4 blocks,
    d_model 512, vocabulary 12000) trained 3 steps with Adam; its weights and the optimizer's
    state saved with torch.save into memory; the optimizer dropped and empty_cache() called;
    the checkpoint loaded back with map_location onto the device (a second copy of every
    tensor beside the model's), loaded into the model and a fresh Adam, the loaded copy
    dropped; 3 more steps at another length; then the weights converted to float16 (each one
    made again) and inference under inference_mode over batches of 4 to 64 rows of 128 tokens,
    whose logits (up to 188 MiB) lie beyond any max_split_size; an inference that runs out of
    memory is caught and retried at half the batch."""
    import io
    seed_all(41)
    vocab = 12000
    model = LanguageModel(vocab, 512, 8, 4).to(job.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(3):
        lm_step(model, optimizer, torch.randint(0, vocab, (8, 257), device=job.device))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    del optimizer
    job.empty_cache()
    buffer.seek(0)
    loaded = torch.load(buffer, map_location=job.device)
    model.load_state_dict(loaded["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    optimizer.load_state_dict(loaded["optimizer"])
    del loaded, buffer
    for _ in range(3):
        lm_step(model, optimizer, torch.randint(0, vocab, (6, 385), device=job.device))
    del optimizer
    model.half().eval()

    def infer(batch):
        """The top token of the first row's last position, for `batch` random rows."""
        with torch.inference_mode():
            tokens = torch.randint(0, vocab, (batch, 128), device=job.device)
            logits = model(tokens)
            top = int(logits[:, -1].argmax(dim=-1)[0])
            del tokens, logits
            return top

    for batch in (4, 24, 64, 40, 12, 64, 32, 56):
        job.notes.setdefault("top_tokens", []).append(halving_on_oom(job, batch, infer))
    job.synchronize()


class ClipNet(nn.Module):
    """A small 3D convolutional net over (batch, channels, time, rows, columns) clips: two
    strided 3x3x3 stages, pooled to a 64-wide feature per clip."""

    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(
            nn.Conv3d(3, 32, 3, stride=(1, 2, 2), padding=1), nn.ReLU(),
            nn.Conv3d(32, 64, 3, stride=2, padding=1), nn.ReLU())

    def forward(self, x):
        return self.stages(x).mean(dim=(2, 3, 4))


def frames(job):
    """Video clips of a new size every step, as a preprocessing-plus-model loop meets them:
    20 clips of 8 to 32 frames at 288 to 720 rows by 16/9 as many columns (seeded), each made
    on the device as uint8 (as a decoder hands them over, up to 85 MiB), converted to float16
    and normalised (two copies of twice that), resized to 112 x 112 and passed through a small
    3D conv net under no_grad; the last 3 clips' resized frames are kept in a ring (each new
    one made before the oldest is dropped). Every 7 clips empty_cache() is called. A clip that
    runs out of memory is caught and done again in two halves along time."""
    seed_all(43)
    generator = torch.Generator().manual_seed(43)
    # float16 on the GPU; the CPU's 3D convolution wants float32 (cpu_check.py).
    dtype = torch.float16 if job.cuda else torch.float32
    net = ClipNet().to(job.device, dtype).eval()
    mean = torch.tensor([0.45, 0.45, 0.45], device=job.device, dtype=dtype).view(3, 1, 1, 1)
    ring = []

    def features(clip):
        """The resized clip and its features: uint8 (T, H, W, 3) -> float16 (3, T, 112, 112)."""
        x = clip.permute(3, 0, 1, 2).to(dtype)
        x = (x / 255.0 - mean) / 0.225
        small = F.interpolate(x, size=(112, 112), mode="bilinear", align_corners=False)
        del x
        return small, net(small.unsqueeze(0))

    with torch.no_grad():
        for index in range(20):
            count = 8 * int(torch.randint(1, 5, (1,), generator=generator))
            rows = 144 * int(torch.randint(2, 6, (1,), generator=generator))
            columns = rows * 16 // 9
            clip = torch.randint(0, 256, (count, rows, columns, 3), dtype=torch.uint8,
                                 device=job.device)
            try:
                small, feature = features(clip)
            except torch.OutOfMemoryError as error:
                job.caught_oom(error)
                halves = [features(part) for part in clip.split(count // 2)]
                small = torch.cat([h[0] for h in halves], dim=1)
                feature = torch.stack([h[1] for h in halves]).mean(dim=0)
                del halves
            del clip
            job.notes.setdefault("feature_sums", []).append(round(float(feature.sum()), 2))
            ring.append(small)
            if len(ring) > 3:
                ring.pop(0)
            del small, feature
            if index % 7 == 6:
                job.empty_cache()
    del ring
    job.synchronize()


# --- the twelfth wave (results-wave12/), written after the eleventh session and not fitted
# to: beam search reordering its KV cache every step with the token history copied out on a
# side stream, and a diffusion sampler whose decoder's buffers outgrow its sampler's. Both also
# run under TWELFTH_CONFIGS in plan.py.


def beam(job):
    """Beam search (4 beams) over a 3-block bfloat16 language model (d_model 512): three
    requests of (prompts, prompt length, new tokens) = (8, 64, 96), (6, 200, 64), (8, 32, 160).
    Every step re-orders every KV-cache tensor by the chosen beams (index_select: a new tensor
    of the same size, the old one freed) and then grows it by one token (torch.cat: 32 KiB per
    token per tensor at 32 rows, up to 6 MiB); the log-probabilities are float32 (1 MiB at 32
    rows) and the prompt's logits cover every position (up to 75 MiB). Every 16 steps the token
    history is copied to pinned host memory on a side stream (record_stream: its free is
    deferred until the copy is done). empty_cache() runs after the second request. A request
    that runs out of memory is caught and done again with half the prompts."""
    seed_all(47)
    vocab, beams = 8192, 4
    model = LanguageModel(vocab, 512, 8, 3).to(job.device, torch.bfloat16).eval()
    generator = torch.Generator().manual_seed(47)
    side = job.stream()
    copies = []

    def copy_out(history):
        """history's rows, copied to host memory on the side stream (its block is kept from
        reuse until the copy is done)."""
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(job.device))
        with job.on_stream(side):
            job.record_stream(history)
            host = job.pin(torch.empty(history.shape, dtype=history.dtype))
            host.copy_(history, non_blocking=job.cuda)
        copies.append(host)

    def generate(prompts, prompt_length, new_tokens):
        """The best beam's token sum for each prompt."""
        rows = prompts * beams
        prompt = torch.randint(0, vocab, (prompts, prompt_length), generator=generator)
        tokens = prompt.to(job.device).repeat_interleave(beams, dim=0)
        caches = [[None, None] for _ in model.blocks]
        logits = model.decode(tokens, caches)
        last = logits[:, -1].float().log_softmax(-1)
        del logits, tokens
        scores = torch.zeros(prompts, beams, device=job.device)
        scores[:, 1:] = -1e9  # one live beam per prompt at the start
        scores = scores.view(-1)
        offsets = (torch.arange(prompts, device=job.device) * beams).unsqueeze(1)
        history = torch.empty(rows, 0, dtype=torch.long, device=job.device)
        for step in range(new_tokens):
            total = (scores.unsqueeze(1) + last).view(prompts, beams * vocab)
            top_scores, top_index = total.topk(beams, dim=1)
            del total, last
            chosen = (top_index // vocab + offsets).view(-1)
            next_token = (top_index % vocab).view(-1, 1)
            for cache in caches:
                cache[0] = cache[0].index_select(0, chosen)
                cache[1] = cache[1].index_select(0, chosen)
            history = torch.cat([history.index_select(0, chosen), next_token], dim=1)
            scores = top_scores.view(-1)
            del top_scores, top_index, chosen
            logits = model.decode(next_token, caches)
            last = logits[:, -1].float().log_softmax(-1)
            del logits, next_token
            if step % 16 == 15:
                copy_out(history)
        best = scores.view(prompts, beams).argmax(dim=1) + offsets.view(-1)
        sums = history.index_select(0, best).sum(dim=1).tolist()
        del caches, history, last, scores
        return sums

    with torch.no_grad():
        for index, (prompts, length, new_tokens) in enumerate(((8, 64, 96), (6, 200, 64),
                                                               (8, 32, 160))):
            sums = halving_on_oom(job, prompts,
                                  lambda p, n=length, t=new_tokens: generate(p, n, t))
            job.notes.setdefault("best_token_sums", []).append(sums)
            if index == 1:
                job.synchronize()
                job.empty_cache()
    job.synchronize()
    job.notes["host_copies"] = len(copies)


class LatentDecoder(nn.Module):
    """A VAE-style decoder from 4 latent channels to an RGB image 8 times larger: three
    nearest-neighbour upsamplings, each followed by a 3x3 convolution (128, 128, 64 channels)."""

    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(
            nn.Conv2d(4, 128, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2), nn.Conv2d(128, 128, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2), nn.Conv2d(128, 64, 3, padding=1), nn.SiLU(),
            nn.Upsample(scale_factor=2), nn.Conv2d(64, 64, 3, padding=1), nn.SiLU(),
            nn.Conv2d(64, 3, 3, padding=1))

    def forward(self, latents):
        return self.stages(latents)


def diffusion(job):
    """A diffusion sampler as image-generation scripts run it, float16 under no_grad: for four
    prompts of (images, latent rows, latent columns) = (2, 64, 64), (4, 48, 48), (1, 96, 64),
    (3, 64, 80), 12 denoising steps of a U-Net (32..256 channels, 4 latent channels) with
    classifier-free guidance (the latents concatenated with themselves: a doubled batch every
    step), then a decoder to 8x the latent size (for 3 images at 512 x 640, two 120 MiB activations
    live at once, beyond any max_split_size_mb of the configs). The decoded images are converted to uint8 and copied to the host. A decode that
    runs out of memory is caught and done again in chunks of half the images (as tiled VAE
    decoding does). empty_cache() runs after the third prompt."""
    seed_all(53)
    dtype = torch.float16 if job.cuda else torch.float32
    denoiser = UNet(cin=4, cout=4).to(job.device, dtype).eval()
    decoder = LatentDecoder().to(job.device, dtype).eval()
    generator = torch.Generator().manual_seed(53)
    guidance = 7.5

    def sample(images, rows, columns):
        latents = torch.randn(images, 4, rows, columns, generator=generator).to(job.device, dtype)
        for step in range(12):
            doubled = torch.cat([latents, latents])
            unconditional, conditional = denoiser(doubled).chunk(2)
            noise = unconditional + guidance * (conditional - unconditional)
            del doubled, unconditional, conditional
            latents = latents - (0.08 / (1 + step)) * noise
            del noise
        return latents

    def decode(latents, chunk):
        """uint8 images on the host, decoded `chunk` latents at a time."""
        pictures = []
        for part in latents.split(chunk):
            image = decoder(part)
            pixels = ((image.clamp(-1, 1) + 1) * 127.5).to(torch.uint8)
            del image
            pictures.append(pixels.cpu())
            del pixels
        return torch.cat(pictures)

    with torch.no_grad():
        for index, (images, rows, columns) in enumerate(((2, 64, 64), (4, 48, 48), (1, 96, 64),
                                                         (3, 64, 80))):
            latents = sample(images, rows, columns)
            pictures = halving_on_oom(job, images, lambda chunk: decode(latents, chunk))
            job.notes.setdefault("picture_means", []).append(round(float(pictures.float().mean()), 3))
            del latents, pictures
            if index == 2:
                job.empty_cache()
    job.synchronize()


WORKLOADS = {
    "transformer_ckpt": transformer_ckpt,
    "unet": unet,
    "kv_decoder": kv_decoder,
    "prefetch": prefetch,
    "compiled": compiled,
    "compiled_lm": compiled_lm,
    "user_graphs": user_graphs,
    "mem_pools": mem_pools,
    "compiled_shapes": compiled_shapes,
    "two_streams": two_streams,
    "moe": moe,
    "bs_search": bs_search,
    "mlp": mlp,
    "fsdp": fsdp,
    "resnet": resnet,
    "amp_lm": amp_lm,
    "lstm": lstm,
    "serve": serve,
    "vit": vit,
    "offload": offload,
    "varlen": varlen,
    "graph_decode": graph_decode,
    "buckets": buckets,
    "chunked_ce": chunked_ce,
    "graph_evict": graph_evict,
    "pool_phases": pool_phases,
    "pool_cache": pool_cache,
    "pool_retry": pool_retry,
    "pool_side": pool_side,
    "pipeline": pipeline,
    "finetune": finetune,
    "resume": resume,
    "frames": frames,
    "beam": beam,
    "diffusion": diffusion,
}
