"""Speed of one training step: gptrain's step against a plain-PyTorch loop of the same shapes.

    python bench/train_step.py --preset gpt3/126m --micro-batch-size 4 --seq-length 2048 \
        --precision bf16 --compile --steps 20 --warmup 5 [key.sub=value ...]

gptrain's side is what `gptrain train` runs on one device: the model from the preset built by
gptrain's builders, activation checkpointing and torch.compile as configured, gptrain's AdamW and
`train_step` (token-weighted loss, loss scaling, grad-norm, clipping). The reference is a minimal
eager GPT of the same shapes (fused-qkv attention through scaled_dot_product_attention; learned or
rotary positions and a tied or own output head, as configured) with its own
forward/backward/AdamW step, the loop everyone writes first. Both see the same fixed random batch. Prints a table and one JSON line (machine-readable; docs/performance.md quotes it).
`--separate-projections` adds gptrain with q/k/v (and w1/w3) as separate GEMMs, as before
gptrain.models.gpt.fused_linears, to measure what the fused GEMM gains in the same command.
`--run-ahead` adds gptrain in the loop's order with trainer.run_ahead (the next step's
forward/backward queued before a step's results are read) and times every row back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gptrain.config import TrainingConfig, load_training_config
from gptrain.errors import GptrainError
from gptrain.models import gpt
from gptrain.models.flops import (
    count_parameters,
    device_peak_tflops,
    megatron_flops_per_iteration,
    pad_vocab_size,
)
from gptrain.parallel.mesh import World
from gptrain.train import builders
from gptrain.train.step import (
    PRECISION_DTYPES,
    Batch,
    queue_device_update,
    queue_forward_backward,
    step_outcome,
    train_step,
    updates_on_device,
)

GPT2_VOCAB = 50257


@dataclass
class Measurement:
    name: str
    seconds_per_step: float
    tokens_per_second: float
    tflops_per_gpu: float
    mfu: float | None
    loss_first: float
    loss_last: float
    peak_memory_gib: float | None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt3/126m", help="training preset (default gpt3/126m)")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=None, help="default: the micro batch size")
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--precision", default="bf16", choices=["32", "16", "bf16"])
    parser.add_argument("--compile", action="store_true", help="model.compile=true for gptrain")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile, allocator)")
    parser.add_argument(
        "--reference",
        default="both",
        choices=["both", "compiled", "eager", "none"],
        help="baselines run in the same command: the plain eager loop, the whole model + loss under "
        "torch.compile with fused AdamW (what a user would write), both, or none",
    )
    parser.add_argument("--label", default="gptrain", help="name of gptrain's row in the table")
    parser.add_argument(
        "--separate-projections",
        action="store_true",
        help="also run gptrain with q/k/v (and w1/w3) as separate GEMMs (the baseline of the fused GEMM)",
    )
    parser.add_argument(
        "--run-ahead",
        action="store_true",
        help="also run gptrain in the loop's order with trainer.run_ahead (the next step's forward/backward "
        "queued before a step is read); every row is then timed back to back (implies --back-to-back)",
    )
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="time the steps as one window (one synchronisation before and after) instead of each step "
        "alone; the mean step time, as a training run sees it",
    )
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    args = parser.parse_intermixed_args(argv)
    if args.steps < 1 or args.warmup < 0:  # no timed step: no median, no rate
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: give --steps >= 1 and --warmup >= 0")
    return args


def bench_config(args: argparse.Namespace) -> TrainingConfig:
    """The preset with the benchmark's shape; mock data so no tokenizer or dataset is needed."""
    seq = args.seq_length
    overrides = [
        f"model.micro_batch_size={args.micro_batch_size}",
        f"model.global_batch_size={args.global_batch_size or args.micro_batch_size}",
        f"model.encoder_seq_length={seq}",
        f"model.max_position_embeddings={seq}",
        f"model.data.seq_length={seq}",
        f"trainer.precision={args.precision}",
        f"model.compile={args.compile}",
        "trainer.num_nodes=1",
        "trainer.devices=1",
        "model.data.data_impl=mock",
        f"model.data.mock_vocab_size={GPT2_VOCAB}",
        *args.overrides,
    ]
    return load_training_config(args.preset, overrides, report_ignored=False)


def random_microbatches(cfg: TrainingConfig, vocab: int, device: torch.device) -> list[Batch]:
    """A fixed batch of uniform random tokens, split into micro-batches, already on `device`."""
    m = cfg.model
    generator = torch.Generator().manual_seed(1234)
    count = m.global_batch_size // m.micro_batch_size
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, vocab, (m.micro_batch_size, m.encoder_seq_length + 1), generator=generator)
        batches.append(
            {
                "tokens": tokens[:, :-1].to(device),
                "labels": tokens[:, 1:].to(device),
                "loss_mask": torch.ones(tokens[:, 1:].shape, device=device),
            }
        )
    return batches


def gptrain_parts(cfg: TrainingConfig, model_config, device: torch.device, separate: bool = False) -> tuple:
    """What `gptrain train` builds on one device: the parallel seam (AC, FP8, compile as
    configured), gptrain's AdamW and loss scaler, the layout's step options (the compiled loss)."""
    world = World(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=0)
    builders.seed_everything(cfg.model.seed)
    model = builders.build_parallel_model(model_config, cfg, world, device)
    if separate:  # q/k/v (and w1/w3) as separate GEMMs, as pipeline stages run them
        gpt.separate_projections(model)
    optimizer = builders.build_adamw(cfg, model, device)
    scaler = builders.build_scaler(cfg)
    opts = builders.with_parallel_seams(builders.build_step_options(cfg, 1), model)
    return model, optimizer, scaler, opts


def gptrain_step(
    cfg: TrainingConfig, model_config, device: torch.device, batches: list[Batch], separate: bool = False
) -> Callable[[], float]:
    """gptrain's train_step: the step reads its results before the next one is queued."""
    model, optimizer, scaler, opts = gptrain_parts(cfg, model_config, device, separate)
    return lambda: train_step(model, optimizer, batches, scaler, device, opts).loss


def gptrain_run_ahead(
    cfg: TrainingConfig, model_config, device: torch.device, batches: list[Batch]
) -> Callable[[], float] | None:
    """The loop's order with trainer.run_ahead between steps that need no bookkeeping
    (gptrain.train.overlap): queue this step's update, then the next step's forward/backward, then
    read this step. None where the update needs the host (no fused AdamW: the CPU, fp16)."""
    model, optimizer, scaler, opts = gptrain_parts(cfg, model_config, device)
    if not updates_on_device(optimizer, scaler):
        return None
    queued = [queue_forward_backward(model, optimizer, batches, scaler, device, opts)]

    def step() -> float:
        result = queue_device_update(optimizer, *queued[0], device, opts)
        queued[0] = queue_forward_backward(model, optimizer, batches, scaler, device, opts)
        return step_outcome(scaler, opts, *result.read()).loss

    return step


class ReferenceBlock(nn.Module):
    """Pre-LN block: fused qkv + SDPA attention, GELU or SwiGLU MLP."""

    def __init__(self, c) -> None:
        super().__init__()
        h, self.head_dim = c.hidden_size, c.head_dim
        self.q_dim, self.kv_dim = c.num_attention_heads * c.head_dim, c.query_groups * c.head_dim
        norm = nn.RMSNorm if c.normalization == "rmsnorm" else nn.LayerNorm
        self.norm1, self.norm2 = norm(h, eps=c.layernorm_epsilon), norm(h, eps=c.layernorm_epsilon)
        self.qkv = nn.Linear(h, self.q_dim + 2 * self.kv_dim, bias=c.bias)
        self.proj = nn.Linear(self.q_dim, h, bias=c.bias)
        self.gated = c.gated_mlp
        self.fc = nn.Linear(h, c.ffn_size * (2 if self.gated else 1), bias=c.bias)
        self.out = nn.Linear(c.ffn_size, h, bias=c.bias)
        self.p_hidden, self.p_attention = c.hidden_dropout, c.attention_dropout
        self.rotary_dim, self.rotary_base = c.rotary_dim, float(c.rotary_base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.rotary_dim:
            q, k = rope(q, self.rotary_dim, self.rotary_base), rope(k, self.rotary_dim, self.rotary_base)
        p = self.p_attention if self.training else 0.0
        a = F.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
        )
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, -1)), self.p_hidden, self.training)
        up = self.fc(self.norm2(x))
        if self.gated:
            gate, up = up.chunk(2, dim=-1)
            up = F.silu(gate) * up
        else:
            up = F.gelu(up)
        return x + F.dropout(self.out(up), self.p_hidden, self.training)


def rope(x: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """Rotary position embedding of the first `rotary_dim` channels of each head (rotate-half)."""
    positions = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)
    inv_freq = base ** -(torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.float32) / rotary_dim)
    angles = torch.outer(positions, inv_freq).repeat(1, 2)
    rotated, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    first, second = rotated.chunk(2, dim=-1)
    turned = torch.cat((-second, first), dim=-1)
    rotated = rotated * angles.cos().to(x.dtype) + turned * angles.sin().to(x.dtype)
    return torch.cat((rotated, rest), dim=-1)


class ReferenceGPT(nn.Module):
    """The eager GPT people write first: token (+ learned position) tables, blocks, final norm,
    output head (tied to the token table or its own), as the preset configures gptrain's."""

    def __init__(self, c) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.position_rows, c.hidden_size) if c.position_rows else None
        self.head = (
            None
            if c.share_embeddings_and_output_weights
            else nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        )
        self.blocks = nn.ModuleList(ReferenceBlock(c) for _ in range(c.num_layers))
        norm = nn.RMSNorm if c.normalization == "rmsnorm" else nn.LayerNorm
        self.norm = norm(c.hidden_size, eps=c.layernorm_epsilon)
        self.p_hidden = c.hidden_dropout
        for module in self.modules():  # GPT-2 init: normal(0, std) weights, zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=c.init_method_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.position is not None:
            x = x + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        x = F.dropout(x, self.p_hidden, self.training)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ (self.embed.weight if self.head is None else self.head.weight).t()


def reference_step(
    cfg: TrainingConfig, model_config, device: torch.device, batches: list[Batch], compiled: bool = False
) -> Callable[[], float]:
    """Plain PyTorch: autocast, mean cross-entropy, GradScaler for fp16, clip, AdamW (fused on CUDA).

    compiled=True puts the whole model and the loss under one torch.compile, as nanoGPT does.
    """
    optim, precision = cfg.model.optim, cfg.trainer.precision
    model = ReferenceGPT(model_config).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
        weight_decay=optim.weight_decay, fused=device.type == "cuda",
    )  # fmt: skip
    dtype = PRECISION_DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "16")
    clip = cfg.trainer.gradient_clip_val

    def mean_loss(tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(tokens)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    loss_fn = torch.compile(mean_loss) if compiled else mean_loss

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for batch in batches:
            loss = loss_fn(batch["tokens"], batch["labels"]) / len(batches)
            scaler.scale(loss).backward()
            total += loss.detach()
        scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        return float(total)

    return step


def release(device: torch.device) -> None:
    """Free the previous loop's memory so each loop's peak is its own."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, step: Callable[[], float], args: argparse.Namespace, work: dict) -> Measurement:
    """Median step time over `args.steps` timed steps after `args.warmup` untimed ones (with
    --back-to-back or --run-ahead: their mean over one window, as a run sees them)."""
    device = work["device"]
    losses = [step() for _ in range(args.warmup)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if args.back_to_back or args.run_ahead:
        synchronize(device)
        start = time.perf_counter()
        losses.extend(step() for _ in range(args.steps))
        synchronize(device)
        seconds = (time.perf_counter() - start) / args.steps
    else:
        times = []
        for _ in range(args.steps):
            synchronize(device)
            start = time.perf_counter()
            losses.append(step())
            synchronize(device)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
    tflops = work["flops"] / seconds / 1e12
    peak_memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return Measurement(
        name=name,
        seconds_per_step=seconds,
        tokens_per_second=work["tokens"] / seconds,
        tflops_per_gpu=tflops,
        mfu=tflops / work["peak"] if work["peak"] else None,
        loss_first=losses[0],
        loss_last=losses[-1],
        peak_memory_gib=peak_memory,
    )


def print_table(rows: list[Measurement], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("loop", "ms/step", "tokens/s", "TFLOP/s/GPU", "MFU", "loss first -> last", "peak GiB"):
        table.add_column(column, justify="left" if column == "loop" else "right")
    for row in rows:
        table.add_row(
            row.name,
            f"{1000 * row.seconds_per_step:.1f}",
            f"{row.tokens_per_second:,.0f}",
            f"{row.tflops_per_gpu:.3f}",
            f"{100 * row.mfu:.1f}%" if row.mfu is not None else "n/a",
            f"{row.loss_first:.3f} -> {row.loss_last:.3f}",
            f"{row.peak_memory_gib:.2f}" if row.peak_memory_gib is not None else "n/a",
        )
    Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160).print(table)  # logs: no wrapping


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = bench_config(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    padded = pad_vocab_size(GPT2_VOCAB, cfg.model.make_vocab_size_divisible_by, 1)
    model_config = builders.build_model_config(cfg, padded)
    name = device_description(device)
    work = {
        "device": device,
        "flops": megatron_flops_per_iteration(model_config, cfg.model.global_batch_size),
        "tokens": cfg.model.global_batch_size * cfg.model.encoder_seq_length,
        "peak": device_peak_tflops(name, cfg.trainer.precision) if device.type == "cuda" else None,
    }
    batches = random_microbatches(cfg, GPT2_VOCAB, device)
    rows = [measure(args.label, gptrain_step(cfg, model_config, device, batches), args, work)]
    release(device)
    if args.run_ahead:
        step = gptrain_run_ahead(cfg, model_config, device, batches)
        if step is None:
            print("--run-ahead: this run's update needs the host (no fused AdamW here): not measured")
        else:
            rows.append(measure(f"{args.label}, run ahead", step, args, work))
            del step  # the loop just measured (its model, optimizer state) is freed before the next is built
            release(device)
    if args.separate_projections:
        step = gptrain_step(cfg, model_config, device, batches, separate=True)
        rows.append(measure(f"{args.label}, separate q/k/v GEMMs", step, args, work))
        del step
        release(device)
    if args.reference in ("both", "compiled"):
        step = reference_step(cfg, model_config, device, batches, compiled=True)
        rows.append(measure("whole model + loss compiled (reference)", step, args, work))
        del step
        release(device)
    if args.reference in ("both", "eager"):
        step = reference_step(cfg, model_config, device, batches)
        rows.append(measure("plain PyTorch (eager)", step, args, work))
    title = (
        f"{args.preset}  mbs {cfg.model.micro_batch_size}  gbs {cfg.model.global_batch_size}  "
        f"seq {cfg.model.encoder_seq_length}  {cfg.trainer.precision}  compile={cfg.model.compile}  "
        f"fp8={cfg.model.fp8}  on {name}"
    )
    print_table(rows, title)
    result = {
        "bench": "train_step",
        "preset": args.preset,
        "device": name,
        "precision": cfg.trainer.precision,
        "micro_batch_size": cfg.model.micro_batch_size,
        "global_batch_size": cfg.model.global_batch_size,
        "seq_length": cfg.model.encoder_seq_length,
        "compile": cfg.model.compile,
        "compile_mode": cfg.model.compile_mode,
        "fp8": cfg.model.fp8,
        "fp8_recipe": cfg.model.fp8_recipe,
        "parameters": count_parameters(model_config),
        "flops_per_step": work["flops"],
        "results": [asdict(row) for row in rows],
    }
    for row in rows[1:]:
        ratio = row.seconds_per_step / rows[0].seconds_per_step
        result.setdefault("speedup_vs", {})[row.name] = ratio
        print(f"{args.label} / {row.name} throughput: {ratio:.2f}x")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GptrainError as error:  # bad input (a shape, a key.sub=value): one line, no traceback
        raise SystemExit(f"train_step.py: {error}") from None
