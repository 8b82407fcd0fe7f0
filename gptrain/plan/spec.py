"""What is planned: a Workload (model, batch, precision) and a Layout (how it is split).

A Layout maps one to one onto `model.*` keys of the training config, so the winner of a plan is
a list of overrides `gptrain train`/`launch` accept as they are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gptrain.config.normalize import data_parallel_sharding
from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.flops import vocab_rows
from gptrain.train.model_config import build_model_config

# Vocabulary sizes of the tokenizers the presets name, so planning needs no tokenizer files.
KNOWN_VOCAB = {"GPT2BPETokenizer": 50257, "gpt2": 50257, "r50k_base": 50257, "cl100k_base": 100277}


SPLIT_KEYS = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)
"""The model keys of an uneven pipeline split, which a Layout carries as they are."""

SHARDING_LABELS = {"ddp": [], "shard_grad_op": ["zero2"], "full_shard": ["fsdp"], "hybrid_shard": ["hsdp"]}
"""model.data_parallel_sharding as a layout's label shows it (ddp shows nothing)."""


@dataclass(frozen=True)
class Workload:
    """The model and the job-level choices that decide cost, whatever the layout."""

    model: GPTConfig
    """Shapes with the UNPADDED vocabulary; `padded(tp)` pads it as Megatron does for a TP size."""
    make_vocab_size_divisible_by: int
    global_batch_size: int
    precision: str
    """trainer.precision as configured (bf16, 16, 32, ...)."""
    ramp_batches: tuple[int, ...] = ()
    """The smaller global batches a model.rampup_batch_size ramp trains before global_batch_size."""
    compile: bool = False
    flash_attention: bool = True
    """SDPA's flash/memory-efficient kernels (no s x s scores kept); false on CPU with dropout."""
    device_type: str = "cuda"
    """'cuda' keeps dropout masks as bools; on 'cpu' dropout keeps its scaled noise in the input dtype."""
    fp8: bool = False
    """model.fp8: the block Linears run through torchao's Float8Linear (tensorwise or rowwise)."""
    fp8_fsdp_gather: bool = False
    """Under FSDP those Linears' weights are all-gathered as float8, 1 byte each (tensorwise FP8 with
    model.fp8_fsdp_all_gather; gptrain.parallel.float8.gathers_float8)."""
    padded_vocab_size: int | None = None
    """model.padded_vocab_size: the embedding's rows at every TP (null: padded by the multiple)."""

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def padded_vocab(self, tp: int) -> int:
        return vocab_rows(
            self.model.vocab_size,
            self.make_vocab_size_divisible_by,
            tp,
            self.padded_vocab_size,
            "the vocabulary",
        )

    def padded(self, tp: int) -> GPTConfig:
        """The model as built under tensor parallel size `tp` (vocabulary padded x TP)."""
        return dataclasses.replace(self.model, vocab_size=self.padded_vocab(tp))

    @property
    def mixed(self) -> bool:
        """True when matmuls run in 16 bits under autocast (fp32 master weights kept)."""
        return str(self.precision).lower() not in ("32", "32-true", "fp32", "float32")

    @property
    def bf16(self) -> bool:
        """bf16 autocast (FSDP then gathers parameters in bf16; fp16 and fp32 gather them in fp32)."""
        return str(self.precision).lower() in ("bf16", "bf16-mixed", "bf16-true")


@dataclass(frozen=True)
class Layout:
    """How one step is split over the GPUs; dp is world / (tp x pp)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    sequence_parallel: bool = False
    sharding: str = "ddp"
    """model.data_parallel_sharding: ddp, shard_grad_op, full_shard or hybrid_shard."""
    dp_shard: int = 0
    """FSDP shard group size (dp for full_shard, one node's DP ranks for hybrid_shard, 0 for DDP)."""
    recompute: str | None = None
    """model.activations_checkpoint_granularity: None, 'selective' or 'full'."""
    recompute_num_layers: int | None = None
    """With full + method block: the first N blocks of each pipeline chunk are checkpointed."""
    num_layers_in_first_pipeline_stage: int | None = None
    """The model keys of an uneven pipeline split (gptrain.parallel.layout.stage_layer_counts); the
    planner's own layouts split evenly, a config's requested layout keeps its split."""
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def stage_layers(self, num_layers: int) -> list[int]:
        """Transformer layers of each pipeline stage (rank r's chunk v is stage v x pp + r)."""
        from gptrain.parallel.layout import stage_layer_counts

        split = SimpleNamespace(num_layers=num_layers, **{key: getattr(self, key) for key in SPLIT_KEYS})
        return stage_layer_counts(split, self.pp, self.vpp)

    def rank_layers(self, num_layers: int) -> list[int]:
        """Transformer layers of each pipeline rank: an equal share, or the uneven split asked for."""
        from gptrain.parallel.layout import pipeline_rank_layers

        return pipeline_rank_layers(self.stage_layers(num_layers), self.pp)

    def microbatches(self, global_batch_size: int) -> int:
        return global_batch_size // (self.micro_batch_size * self.dp)

    def overrides(self) -> list[str]:
        """The `model.*` overrides that select this layout."""
        out = [
            f"model.tensor_model_parallel_size={self.tp}",
            f"model.pipeline_model_parallel_size={self.pp}",
            f"model.virtual_pipeline_model_parallel_size={self.vpp if self.vpp > 1 else 'null'}",
            f"model.micro_batch_size={self.micro_batch_size}",
            f"model.sequence_parallel={str(self.sequence_parallel).lower()}",
            f"model.data_parallel_sharding={self.sharding}",
            "model.fsdp=false",  # NeMo's switch, when a config sets it, would override the sharding above
            f"model.activations_checkpoint_granularity={self.recompute or 'null'}",
            # the config's own uneven split would otherwise stay, on another pipeline size
            *(f"model.{key}={_override_value(getattr(self, key))}" for key in SPLIT_KEYS),
        ]
        if self.recompute == "full":
            method = "block" if self.recompute_num_layers is not None else "uniform"
            out.append(f"model.activations_checkpoint_method={method}")
            # block with 0 layers is its own layout (no block rebuilt), not uniform's default 1
            count = 1 if self.recompute_num_layers is None else self.recompute_num_layers
            out.append(f"model.activations_checkpoint_num_layers={count}")
        return out

    def label(self) -> str:
        """Short name for tables: tp2 pp2 v2 dp4 mbs1 sp fsdp last=5 emb loss ac=sele (full, sele);
        last=/first=: model.num_layers_in_last/first_pipeline_stage; emb/loss: the split accounts for
        the embedding/loss (model.account_for_*_in_pipeline_split), one row apart from the even split."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"] + ([f"v{self.vpp}"] if self.vpp > 1 else [])
        parts += [f"dp{self.dp}", f"mbs{self.micro_batch_size}"]
        parts += ["sp"] if self.sequence_parallel else []
        parts += SHARDING_LABELS[self.sharding]
        parts += [f"first={self.num_layers_in_first_pipeline_stage}"] * (
            self.num_layers_in_first_pipeline_stage is not None
        )
        parts += [f"last={self.num_layers_in_last_pipeline_stage}"] * (
            self.num_layers_in_last_pipeline_stage is not None
        )
        parts += ["emb"] * self.account_for_embedding_in_pipeline_split
        parts += ["loss"] * self.account_for_loss_in_pipeline_split
        if self.recompute:
            parts.append(
                f"ac={self.recompute[:4]}"
                + (f"{self.recompute_num_layers}" if self.recompute_num_layers is not None else "")
            )
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _override_value(value: Any) -> str:
    return "null" if value is None else str(value).lower()


def tiktoken_file_vocabulary(tokenizer: Any) -> int | None:
    """Megatron's TikTokenizer vocabulary file (a .json, as Megatron requires) has exactly
    vocab_size ids, 2**17 unless set: known from the config alone."""
    if tokenizer.type == "TikTokenizer" and str(tokenizer.model).endswith(".json"):
        return tokenizer.vocab_size or 2**17
    return None


def workload_from_config(cfg: Any, vocab_size: int | None = None) -> Workload:
    """Workload of a TrainingConfig; the vocabulary from --vocab-size, mock data or the tokenizer's name."""
    m = cfg.model
    if vocab_size is not None and vocab_size < 1:
        raise ConfigError(f"--vocab-size={vocab_size} must be >= 1 (the tokenizer's unpadded size)")
    vocab = (
        vocab_size if vocab_size is not None else m.data.mock_vocab_size or KNOWN_VOCAB.get(m.tokenizer.type)
    )
    if m.tokenizer.model and not vocab:
        vocab = KNOWN_VOCAB.get(str(m.tokenizer.model)) or tiktoken_file_vocabulary(m.tokenizer)
    if m.tokenizer.type == "NullTokenizer" and not vocab:  # its vocab_size ids, no files
        vocab = m.tokenizer.vocab_size
    if not vocab:
        raise ConfigError(
            f"model.tokenizer.type={m.tokenizer.type!r}: vocabulary size unknown to the planner; "
            "pass --vocab-size N (the tokenizer's unpadded size)"
        )
    work = Workload(
        model=model_config(cfg, int(vocab)),
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
        global_batch_size=m.global_batch_size,
        precision=str(cfg.trainer.precision),
        ramp_batches=ramp_batches(m.rampup_batch_size, m.global_batch_size),
        compile=bool(m.compile),
        fp8=bool(m.fp8),
        fp8_fsdp_gather=bool(m.fp8) and m.fp8_recipe == "tensorwise" and bool(m.fp8_fsdp_all_gather),
        padded_vocab_size=m.padded_vocab_size,
    )
    work.padded_vocab(1)  # a model.padded_vocab_size below the vocabulary: refused before any estimate
    return work


def ramp_batches(ramp: Any, global_batch_size: int) -> tuple[int, ...]:
    """The batches of model.rampup_batch_size [start, increment, samples] below the full one
    (gptrain.train.rampup checks the key when the layout is)."""
    if not ramp or len(ramp) != 3 or ramp[1] <= 0:
        return ()
    return tuple(range(ramp[0], global_batch_size, ramp[1]))


def layout_from_config(
    cfg: Any, devices_per_node: int | None = None, world_size: int | None = None
) -> Layout:
    """The layout `cfg.model` asks for, validated by gptrain.parallel.layout (no torch); over
    `world_size` ranks where given (a running job's), else trainer.num_nodes x trainer.devices."""
    from gptrain.parallel.layout import check_layout

    m = cfg.model
    dims = check_layout(m, world_size or cfg.world_size(), devices_per_node or cfg.trainer.devices)
    full = m.activations_checkpoint_granularity == "full"
    block = full and m.activations_checkpoint_method == "block"
    return Layout(
        tp=dims.tp,
        pp=dims.pp,
        dp=dims.dp,
        vpp=dims.vpp,
        micro_batch_size=m.micro_batch_size,
        sequence_parallel=bool(m.sequence_parallel),
        sharding=data_parallel_sharding(m),
        dp_shard=dims.dp_shard,
        recompute=m.activations_checkpoint_granularity,
        recompute_num_layers=m.activations_checkpoint_num_layers if block else None,
        **{key: getattr(m, key) for key in SPLIT_KEYS},
    )


def model_config(cfg: Any, vocab_size: int) -> GPTConfig:
    """The GPTConfig `gptrain train` builds (one torch-free function serves both)."""
    return build_model_config(cfg, vocab_size)
