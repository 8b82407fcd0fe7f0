"""Parallel layout flags that combine (sharding, processes, pipeline chunks), as Megatron checks them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError
from gptrain.megatron.flag_parsing import convert_value

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


def sequence_parallel(result: Translation) -> None:
    """Megatron's validate_args turns --sequence-parallel off at tensor parallel size 1 (with a
    warning) where gptrain's config refuses the pair: a command line that runs there runs here."""
    if (
        "--sequence-parallel" in result.given
        and result.values.get("model.tensor_model_parallel_size", 1) == 1
    ):
        result.values["model.sequence_parallel"] = False
        result.notes.append(
            "--sequence-parallel (off at --tensor-model-parallel-size 1, as Megatron turns it off)"
        )


# Megatron-FSDP's --data-parallel-sharding-strategy -> model.data_parallel_sharding: optim (ZeRO-1, whole
# gradients) has no equal in gptrain; its nearest is ZeRO-2, as for --use-distributed-optimizer.
MEGATRON_FSDP_SHARDING = {
    "no_shard": "ddp",
    "optim": "shard_grad_op",
    "optim_grads": "shard_grad_op",
    "optim_grads_params": "full_shard",
}


MEGATRON_FSDP_DEFAULT = "optim_grads_params"  # since April 2026; no_shard before


def data_parallel_sharding(result: Translation) -> None:
    """Megatron-FSDP (--use-megatron-fsdp) shards by --data-parallel-sharding-strategy, which Megatron
    reads only beside it, over --use-distributed-optimizer (Megatron-FSDP runs that optimizer itself);
    --use-torch-fsdp2 is PyTorch's fully_shard, gptrain's full_shard, refused beside either, as Megatron
    refuses it."""
    v, given, flag = result.values, result.given, "--data-parallel-sharding-strategy"
    strategy = (given.get(flag) or [MEGATRON_FSDP_DEFAULT])[0]
    sharding = convert_value(flag, strategy, MEGATRON_FSDP_SHARDING)
    if "--use-torch-fsdp2" in given:
        for other in ("--use-megatron-fsdp", "--use-distributed-optimizer"):
            if other in given:
                raise ConfigError(f"--use-torch-fsdp2 and {other}: give one (Megatron refuses the pair)")
        v["model.data_parallel_sharding"] = "full_shard"
    if "--use-megatron-fsdp" not in given:
        if flag in given:
            result.notes.append(f"{flag} (Megatron reads it only with --use-megatron-fsdp)")
        return
    v["model.data_parallel_sharding"] = sharding
    if flag not in given:
        result.notes.append(
            f"no {flag} ({MEGATRON_FSDP_DEFAULT}, Megatron-FSDP's default since April 2026, as full_shard; "
            "no_shard before: give it for that)"
        )
    elif strategy == "optim":
        result.notes.append(
            f"{flag} optim (Megatron's ZeRO-1 keeps whole gradients; gptrain's nearest, shard_grad_op, shards "
            "them too, as for --use-distributed-optimizer)"
        )


def layout_from_environment(v: dict[str, Any], env: dict[str, str]) -> None:
    """Nodes and processes from torchrun/srun's environment; Megatron's default global batch."""
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    local = int(env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or world)
    v["trainer.devices"] = local
    v["trainer.num_nodes"] = max(1, world // max(local, 1))
    if "model.global_batch_size" not in v:
        model_parallel = v.get("model.tensor_model_parallel_size", 1) * v.get(
            "model.pipeline_model_parallel_size", 1
        )
        v["model.global_batch_size"] = v["model.micro_batch_size"] * max(1, world // model_parallel)


UNEVEN_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


def virtual_pipeline(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """--num-virtual-stages-per-pipeline-rank N: Megatron's interleaved schedule with N model chunks
    per rank; --num-layers-per-virtual-pipeline-stage N: with (num_layers / pipeline stages) / N,
    num_layers counting the embedding and loss when switched into the split, as Megatron does;
    Megatron refuses it under an uneven split (the stages hold different numbers of layers)."""
    flag, chunks_flag = "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"
    if flag in given and chunks_flag in given:
        raise ConfigError(f"{flag} and {chunks_flag}: give one of them, as Megatron asserts")
    if chunks_flag in given:
        v["model.virtual_pipeline_model_parallel_size"] = convert_value(
            chunks_flag, given[chunks_flag][0], int
        )
    if flag not in given:
        return
    uneven = [name for name in UNEVEN_FLAGS if name in given]
    if uneven:
        raise ConfigError(
            f"{flag} with {' and '.join(uneven)}: give the chunks per rank with {chunks_flag} instead, "
            "as Megatron asserts under an uneven pipeline split"
        )
    per_chunk = convert_value(flag, given[flag][0], int)
    layers, counted = _layers_in_pipeline_split(v)
    pp = v.get("model.pipeline_model_parallel_size", 1)
    if per_chunk < 1 or layers % pp or (layers // pp) % per_chunk:
        raise ConfigError(
            f"{flag} {per_chunk}: the {counted} per {pp} pipeline stages must split into chunks of "
            f"{per_chunk} layers, as Megatron asserts"
        )
    chunks = layers // pp // per_chunk
    if chunks > 1 and pp < 2:  # one chunk a rank is no interleaving: Megatron runs it as such
        raise ConfigError(
            f"{flag} {per_chunk}: {chunks} chunks a rank interleave over the pipeline stages, and "
            f"--pipeline-model-parallel-size is {pp}: give at least 2, as Megatron asserts"
        )
    v["model.virtual_pipeline_model_parallel_size"] = chunks


# The switches that count a non-layer part as one layer of the pipeline split, and what each counts.
ACCOUNTED_PARTS = {
    "model.account_for_embedding_in_pipeline_split": "embedding",
    "model.account_for_loss_in_pipeline_split": "loss",
}


def _layers_in_pipeline_split(v: dict[str, Any]) -> tuple[int, str]:
    """The layers Megatron splits over the stages, num_layers + 1 for each part counted as a layer
    (the embedding, the loss), and how to say it: it divides these, not num_layers, into chunks."""
    layers = v["model.num_layers"]
    parts = [part for key, part in ACCOUNTED_PARTS.items() if v.get(key)]
    if not parts:
        return layers, f"{layers} layers"
    counted = layers + len(parts)
    return counted, f"{layers} layers " + " ".join(f"+ 1 ({part})" for part in parts) + f" = {counted}"
