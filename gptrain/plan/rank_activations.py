"""What a pipeline rank holds at its peak: micro batches in flight under its schedule, checkpointed blocks."""

from __future__ import annotations

from gptrain.parallel.layout import interleaved_rounds
from gptrain.plan.activations import (
    EAGER,
    compile_scope,
    dtypes,
    embedding_bytes_per_token,
    head_bytes_per_token,
    layer_bytes_per_token,
    loss_saved_bytes_per_token,
    norm_bytes,
    norm_input_bytes,
    residual_bytes,
)
from gptrain.plan.spec import Layout, Workload


def runs_gpipe(layout: Layout, microbatches: int) -> bool:
    """A plain pipeline over fewer micro batches than stages runs torch's ScheduleGPipe
    (gptrain.parallel.pipeline): every forward, and on the last rank every loss, before a backward."""
    return layout.pp > 1 and layout.vpp == 1 and microbatches < layout.pp


def waiting_losses(work: Workload, layout: Layout, scope: str) -> float:
    """On the last rank of a GPipe step, the losses of the other m - 1 micro batches, which wait
    for their backward while the first one runs its own (and rebuilds its checkpointed blocks)."""
    m = layout.microbatches(work.global_batch_size)
    if not runs_gpipe(layout, m):
        return 0.0
    c = work.padded(layout.tp)
    return (
        (m - 1) * loss_saved_bytes_per_token(layout, c, work, scope) * layout.micro_batch_size * c.seq_length
    )


def in_flight(layout: Layout, microbatches: int, rank: int) -> float:
    """Micro batches whose activations pipeline rank `rank` holds at its peak, in units of
    (layers per rank): 1F1B keeps pp - rank (GPipe, over m < pp micro batches, all m); interleaved
    keeps the warmup count of chunks, (v - 1) g + 2 (pp - 1 - rank) + 1, each 1/v of the rank's
    layers, where g, the micro batches a round takes through the chunks, is pp (Megatron's) when pp
    divides them, more when not (torch's schedule: gptrain.parallel.layout.interleaved_rounds)."""
    pp, v = layout.pp, layout.vpp
    if pp == 1:
        return 1.0
    if v == 1:
        return float(microbatches if runs_gpipe(layout, microbatches) else pp - rank)
    per_round = microbatches // interleaved_rounds(microbatches, pp)
    chunks = min((v - 1) * per_round + 2 * (pp - 1 - rank) + 1, microbatches * v)
    return chunks / v


def chunks_in_flight(layout: Layout, microbatches: int, rank: int, costs: list[float]) -> list[int]:
    """Forwards of each of pipeline rank `rank`'s chunks whose backward has not run, at the peak of
    their summed `costs` (one per chunk), in the order of torch's ScheduleInterleaved1F1B: a warmup
    of W = min((v - 1) g + 2 (pp - 1 - rank), m v) forwards, chunk (j // g) mod v for the j-th,
    then 1F1B steps of a forward and then a backward, chunk v - 1 - ((j - W) // g) mod v. Chunks of
    unequal cost (a standalone embedding or loss stage) peak elsewhere than after the warmup. The
    held set repeats every g v steps (each step adds and removes a whole cycle's worth), so one
    cycle of steps gives the peak of any micro-batch count."""
    v, pp = layout.vpp, layout.pp
    per_round = microbatches // interleaved_rounds(microbatches, pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), microbatches * v)
    steady = microbatches * v - warmup
    held = [0] * v
    for step in range(warmup):
        held[(step // per_round) % v] += 1
    peak = list(held)
    for step in range(warmup, warmup + min(steady, per_round * v)):
        held[(step // per_round) % v] += 1
        if _held_cost(held, costs) > _held_cost(peak, costs):
            peak = list(held)
        held[v - 1 - ((step - warmup) // per_round) % v] -= 1
    return peak


def _held_cost(held: list[int] | list[float], costs: list[float]) -> float:
    return sum(count * cost for count, cost in zip(held, costs, strict=True))


def held_chunks(layout: Layout, microbatches: int, rank: int, costs: list[float]) -> list[float]:
    """Micro batches of each of the rank's chunks held at its peak: interleaved, counted in torch's
    order (chunks_in_flight); one chunk otherwise, `in_flight` of them."""
    if layout.vpp == 1:
        return [in_flight(layout, microbatches, rank)]
    return [float(count) for count in chunks_in_flight(layout, microbatches, rank, costs)]


def rank_chunks(layout: Layout, num_layers: int, rank: int) -> list[int]:
    """Layers of each chunk of pipeline rank `rank`, in its local order (stages rank, rank + pp, ...)."""
    return layout.stage_layers(num_layers)[rank :: layout.pp]


def checkpointed_blocks(layout: Layout, chunk: int) -> int:
    """Blocks of a chunk of `chunk` layers that full recompute wraps (gptrain.parallel.activation_checkpoint:
    all of them, or with method block its first N)."""
    if layout.recompute != "full":
        return 0
    return chunk if layout.recompute_num_layers is None else min(chunk, layout.recompute_num_layers)


def blocks_with_weight_copies(work: Workload, layout: Layout, rank: int, scope: str) -> float:
    """Blocks whose autocast 16-bit weight copies pipeline rank `rank` holds at the start of its
    backward. Eager: each block once, whatever the micro batches in flight (the pipeline step runs
    in one autocast region, whose cache gives every forward the same copy). A compiled block casts
    its weights inside its graph on every forward, which saves that copy for its backward: one
    per micro batch in flight (2 ranks, 1F1B over 2 to 4 micro batches: rank 0 held 2 copies of
    each block weight, the last rank 1; tests/plan/test_plan_pipeline_copies.py). Counted for
    blocks without recompute; a checkpointed block (and a selective one, not measured) once."""
    chunks = rank_chunks(layout, work.model.num_layers, rank)
    if scope == EAGER or layout.pp == 1 or layout.recompute == "selective":
        return float(sum(chunks))
    wrapped = [checkpointed_blocks(layout, chunk) for chunk in chunks]
    plain = [float(chunk - n) for chunk, n in zip(chunks, wrapped, strict=True)]
    held = held_chunks(layout, layout.microbatches(work.global_batch_size), rank, plain)
    return sum(wrapped) + _held_cost(held, plain)


def activation_bytes(work: Workload, layout: Layout, rank: int, scope: str | None = None) -> dict[str, float]:
    """Activations saved on pipeline rank `rank` at the start of its backward, by part."""
    c = work.padded(layout.tp)
    tokens = layout.micro_batch_size * c.seq_length
    m = layout.microbatches(work.global_batch_size)
    scope = scope or compile_scope(work, layout)
    per_layer = layer_bytes_per_token(work, layout, c, scope) * tokens
    seq_shard = layout.tp if layout.sequence_parallel else 1
    # what a checkpointed block keeps: its input, a value of the residual stream
    block_input = residual_bytes(work, layout) * c.hidden_size / seq_shard * tokens
    chunks = rank_chunks(layout, c.num_layers, rank)
    wrapped = [checkpointed_blocks(layout, chunk) for chunk in chunks]
    blocks = [n * block_input + (chunk - n) * per_layer for chunk, n in zip(chunks, wrapped, strict=True)]
    # every chunk's output (the residual stream), which torch's PipelineStage keeps until its
    # gradient returns; the model's last stage's is the logits, counted with the loss
    outputs = [block_input if layout.pp > 1 else 0.0] * layout.vpp
    if rank == layout.pp - 1:
        outputs[-1] = 0.0
    embedding = [0.0] * layout.vpp
    if rank == 0:
        embedding[0] = embedding_bytes_per_token(work, layout, c, scope) * tokens
    costs = [sum(chunk) for chunk in zip(blocks, outputs, embedding, strict=True)]
    held = held_chunks(layout, m, rank, costs)
    parts = {"blocks": _held_cost(held, blocks)}
    if rank == 0:
        parts["embedding"] = _held_cost(held, embedding)
    if rank == layout.pp - 1:  # GPipe: every micro batch's head waits for its backward
        heads = m if runs_gpipe(layout, m) else 1
        parts["head"] = heads * head_bytes_per_token(work, layout, c, scope) * tokens
    if any(outputs):
        parts["stage_outputs"] = _held_cost(held, outputs)
    return parts


def rebuild_bytes(work: Workload, layout: Layout, rank: int, scope: str | None = None) -> float:
    """Activations live while the backward rebuilds the first checkpointed block of a micro batch's
    chunk, at the largest over the rank's chunks (full recompute; 0 without a checkpointed block).

    By then the micro batch's head saved tensors and loss are freed (GPipe's others wait), and so
    are the saved tensors of the chunk's blocks after the checkpointed ones (method block): least
    in the chunk with the fewest such blocks, which may hold fewer layers than the others (a
    standalone embedding or loss stage holds none). The rebuilt block keeps what an uncheckpointed
    one keeps, less its input where it saves the stored one itself (not an eager block's bf16
    stream under FSDP on CUDA, or on CPU with RMSNorm: the norm keeps its own fp32 cast), while
    its backward holds the incoming residual gradient (the stream's dtype; under autocast with an
    fp32 stream also its 16-bit copy for the down projection) and the gradient of the down
    projection's input (with a gated MLP, later the gradients of gate and up beside it, where
    more than that copy)."""
    c = work.padded(layout.tp)
    rebuilt = [
        chunk for chunk in rank_chunks(layout, c.num_layers, rank) if checkpointed_blocks(layout, chunk)
    ]
    if not rebuilt:
        return 0.0
    after_checkpointed = min(chunk - checkpointed_blocks(layout, chunk) for chunk in rebuilt)
    tokens = layout.micro_batch_size * c.seq_length
    scope = scope or compile_scope(work, layout)
    parts = activation_bytes(work, layout, rank, scope)
    per_layer = layer_bytes_per_token(work, layout, c, scope) * tokens
    seq_shard = layout.tp if layout.sequence_parallel else 1
    stream = residual_bytes(work, layout)
    block_input = stream * c.hidden_size / seq_shard * tokens
    # the stored input is what the first norm keeps (a compiled block keeps it as its graph input)
    shared = scope != EAGER or norm_input_bytes(work, layout, c) == stream
    shared_input = block_input if shared else 0.0
    freed = after_checkpointed * per_layer
    act = dtypes(work).act
    # an fp32 stream's gradient reaches the 16-bit down projection's output as a 16-bit copy
    cast = act * c.hidden_size / seq_shard * tokens if work.mixed and stream == 4 else 0.0
    down_input = act * c.ffn_size / layout.tp * tokens  # the gradient of the down projection's input
    # a gated MLP's silu(gate) * up then gives the gradients of both its inputs while that one is
    # alive, once the cast and the projection's saved input are freed
    gradients = block_input + down_input + (max(cast, down_input) if c.gated_mlp else cast)
    # before that backward, the rebuild's forward reaches the MLP's activation holding every saved
    # tensor of the block, the residual gradient and its cast, and what the eager block's frame
    # holds besides: the second norm's output, handed to the MLP, where its linears save only casts
    # of it, and the stream after attention, kept for the last residual sum, where that norm saves
    # a cast of it; more than the down projection's gradients where the MLP is narrow (f < 2h)
    per_value = (norm_bytes(work, layout) if work.mixed and norm_bytes(work, layout) == 4 else 0) + (
        0 if norm_input_bytes(work, layout, c) == stream else stream
    )
    if scope == EAGER and per_value:
        gradients = max(gradients, block_input + cast + per_value * c.hidden_size / seq_shard * tokens)
    head_of_one = head_bytes_per_token(work, layout, c, scope) * tokens if "head" in parts else 0.0
    stored = sum(parts.values()) - head_of_one - freed
    if rank == layout.pp - 1:
        stored += waiting_losses(work, layout, scope)
    return stored + per_layer - shared_input + gradients
