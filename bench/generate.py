"""Time `gptrain generate`'s sampling loop with the KV cache against rerunning the whole context for
every token (the loop before the cache), in one command on one model, greedy so both give the same
tokens (checked). With `--prompts N`: N prompts of lengths spread from a quarter of `--prompt` to
all of it, as one padded batch (`--batch-size N` of `gptrain generate`) against one at a time.

    python bench/generate.py                          # 12 x 768 (126m shape), prompt 128, 32 new
    python bench/generate.py --layers 2 --hidden 64 --heads 4 --prompt 16 --new 8
    python bench/generate.py --prompts 8              # batched against one at a time
    python bench/generate.py --device cuda --dtype bf16

Prints one line per loop (seconds, ms per new token) and a JSON line with the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT
from gptrain.trained.sampling import generate, generate_batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--new", type=int, default=32, help="new tokens generated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--prompts", type=int, default=0, help="time N prompts batched against alone")
    args = parser.parse_args(argv)
    if args.prompts < 0:
        parser.error("--prompts must be 0 or more")
    for name in ("layers", "hidden", "heads", "vocab", "seq_length", "prompt", "new"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.prompt + args.new > args.seq_length:
        parser.error("--prompt + --new must fit --seq-length: past it both loops rerun the window")
    return args


def build_model(args: argparse.Namespace) -> GPT:
    config = GPTConfig(
        vocab_size=args.vocab,
        seq_length=args.seq_length,
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.to(device=args.device, dtype=DTYPES[args.dtype]).eval()


def timed(model: GPT, prompt: list[int], new: int, use_cache: bool) -> tuple[float, float, list[int]]:
    """Wall and process CPU seconds of one greedy generation, and its tokens (sampling reads each
    token on the host, so no device work is left running). CPU time is the figure to compare on a
    machine other work loads."""
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    start, start_cpu = time.perf_counter(), time.process_time()
    tokens = generate(model, prompt, new, greedy=True, use_cache=use_cache)
    return time.perf_counter() - start, time.process_time() - start_cpu, tokens


def timed_prompts(model: GPT, prompts: list[list[int]], new: int, batched: bool) -> tuple[float, float, list]:
    """Wall and CPU seconds of greedy generation for every prompt, batched or one at a time."""
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    start, start_cpu = time.perf_counter(), time.process_time()
    if batched:
        tokens = generate_batch(model, prompts, new, greedy=True)
    else:
        tokens = [generate_batch(model, [prompt], new, greedy=True)[0] for prompt in prompts]
    return time.perf_counter() - start, time.process_time() - start_cpu, tokens


def timings(
    args: argparse.Namespace, prompt: dict, fast: tuple[str, float, float], slow: tuple[str, float, float]
) -> dict:
    """The JSON line's shape and timings: each loop's wall and CPU seconds, and slow over fast."""
    (fast_name, fast_s, fast_cpu), (slow_name, slow_s, slow_cpu) = fast, slow
    return {
        "shape": f"{args.layers}x{args.hidden}, vocab {args.vocab}",
        **prompt,
        "new": args.new,
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        f"{fast_name}_s": round(fast_s, 6),
        f"{slow_name}_s": round(slow_s, 6),
        f"{fast_name}_cpu_s": round(fast_cpu, 6),
        f"{slow_name}_cpu_s": round(slow_cpu, 6),
        "speedup": round(slow_s / fast_s, 2),
        "cpu_speedup": round(slow_cpu / max(fast_cpu, 1e-9), 2),
    }


def batch_main(args: argparse.Namespace, model: GPT) -> dict:
    """Batched against one at a time, both through the KV cache."""
    generator = torch.Generator().manual_seed(1)
    lengths = [
        max(1, args.prompt // 4 + (args.prompt - args.prompt // 4) * i // max(1, args.prompts - 1))
        for i in range(args.prompts)
    ]
    prompts = [torch.randint(0, args.vocab, (n,), generator=generator).tolist() for n in lengths]
    generate_batch(model, [p[:8] for p in prompts[:2]], 2, greedy=True)  # warm-up
    batch_s, batch_cpu_s, batched = timed_prompts(model, prompts, args.new, batched=True)
    alone_s, alone_cpu_s, alone = timed_prompts(model, prompts, args.new, batched=False)
    if batched != alone and args.dtype == "fp64":
        sys.exit("generate.py: a batch gave other tokens than its prompts alone in float64")
    for name, seconds, cpu in (("batched", batch_s, batch_cpu_s), ("one at a time", alone_s, alone_cpu_s)):
        print(f"{name:>26}: {seconds:8.3f} s ({cpu:.3f} s CPU) for {args.prompts} prompts")
    result = {
        **timings(
            args, {"prompts": lengths}, ("batched", batch_s, batch_cpu_s), ("alone", alone_s, alone_cpu_s)
        ),
        "same_tokens": batched == alone,
    }
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model = build_model(args)
    if args.prompts:
        return batch_main(args, model)
    prompt = torch.randint(0, args.vocab, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    generate(model, prompt[:8], 2, greedy=True)  # warm-up: allocator, kernels
    cached_s, cached_cpu_s, cached = timed(model, prompt, args.new, use_cache=True)
    full_s, full_cpu_s, full = timed(model, prompt, args.new, use_cache=False)
    if cached != full and args.dtype == "fp64":
        sys.exit("generate.py: the cached loop gave other tokens than the full forward in float64")
    for name, seconds, cpu in (
        ("kv cache", cached_s, cached_cpu_s),
        ("whole context each token", full_s, full_cpu_s),
    ):
        print(
            f"{name:>26}: {seconds:8.3f} s ({cpu:.3f} s CPU), {seconds / args.new * 1e3:9.1f} ms per new token"
        )
    result = {
        **timings(
            args, {"prompt": args.prompt}, ("cached", cached_s, cached_cpu_s), ("full", full_s, full_cpu_s)
        ),
        "same_tokens": cached == full,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
