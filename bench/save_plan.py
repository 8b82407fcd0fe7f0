"""What rank 0 does to plan one checkpoint save, for N ranks, with and without DCP's plan cache.

    python bench/save_plan.py --ranks 8,64,256 [--layers 12 --hidden 768]

Every DCP save gathers each rank's plan (its list of items) on rank 0, which deduplicates the
replicated items across ranks and sends each rank its share back. This builds one rank's plan for
gptrain's real state (a GPT and its AdamW state, as saved), then runs rank 0's global planning on N
copies of it, as under data parallelism where every rank holds the same state: once uncached (every
save before plan caching, and a cached run's first save) and once for a later save of a cached run
(every rank sends an empty plan: its items did not change). Reported per N: rank 0's planning
time and the pickled bytes gathered and sent back. The collectives' own time on a real network is
not measured; the bytes are what they move.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time

import torch

from gptrain.checkpoint.planner import CachingSavePlanner, forget
from gptrain.errors import GptrainError
from gptrain.models.config import GPTConfig
from gptrain.train.builders import build_model
from gptrain.train.optim import build_optimizer
from gptrain.train.state import model_state_dict, optimizer_state_dict


def gpt_state(layers: int, hidden: int, heads: int) -> dict:
    config = GPTConfig(
        vocab_size=50304, seq_length=128, num_layers=layers, hidden_size=hidden, num_attention_heads=heads
    )
    model = build_model(config, torch.device("cpu"), seed=1)
    optimizer = build_optimizer(model, "adamw", 1e-4, 0.1, (0.9, 0.95), 1e-8, "cpu")
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # the AdamW state exists, as at any save
    return {"model": model_state_dict(model), "optim": optimizer_state_dict(model, optimizer)}


def plan_once(state: dict, ranks: int, key: str) -> dict:
    """Rank 0's global planning for `ranks` ranks holding `state`: time and bytes moved."""
    planner = CachingSavePlanner(key)
    planner.set_up_planner(state_dict=state, storage_meta=None, is_coordinator=True)
    local = planner.create_local_plan()  # empty (unusable) when the cache already has this plan
    gathered = [pickle.loads(pickle.dumps(local)) for _ in range(ranks)]
    started = time.perf_counter()
    delta, _ = planner.create_global_plan(gathered)
    seconds = time.perf_counter() - started
    planner.finish_plan(delta[0])  # what the rank does with its share: promotes its plan to the cache
    return {
        "seconds": seconds,
        "gathered_MB": sum(len(pickle.dumps(p)) for p in gathered) / 1e6,
        "sent_MB": sum(len(pickle.dumps(p)) for p in delta) / 1e6,
        "items_per_rank": len(local.items),
    }


def rank_counts(text: str) -> list[int]:
    """--ranks as positive integers ("8,64,256"); [] where any entry is not one."""
    counts = [int(n) if n.strip().isdigit() else 0 for n in text.split(",")]
    return counts if all(n > 0 for n in counts) else []


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", default="8,64,256")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args()
    counts = rank_counts(args.ranks)
    if not counts:
        parser.error(f"--ranks {args.ranks!r}: give positive rank counts separated by commas, as 8,64,256")
    state = gpt_state(args.layers, args.hidden, args.heads)
    rows = []
    for ranks in counts:
        key = f"bench-{ranks}"
        first = plan_once(state, ranks, key)  # fills the cache, as a run's first save
        later = plan_once(state, ranks, key)
        forget(key)
        rows.append({"ranks": ranks, "uncached": first, "cached": later})
        print(
            f"{ranks:5d} ranks, {first['items_per_rank']} items each: uncached {first['seconds']:.3f} s "
            f"({first['gathered_MB']:.1f} MB gathered, {first['sent_MB']:.1f} MB sent back); cached "
            f"{later['seconds']:.4f} s ({later['gathered_MB']:.2f} MB, {later['sent_MB']:.2f} MB)",
            flush=True,
        )
    print(json.dumps({"bench": "save_plan", "args": vars(args), "rows": rows}))


if __name__ == "__main__":
    try:
        main()
    except GptrainError as error:  # bad input (a shape, a key.sub=value): one line, no traceback
        raise SystemExit(f"save_plan.py: {error}") from None
