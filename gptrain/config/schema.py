"""The typed training config, with the NeMo-Megatron launcher's key names.

A user's existing NeMo overrides (`trainer.max_steps=...`, `model.optim.lr=...`) work
unchanged. Fields marked "gptrain extension" have no NeMo counterpart. Each field's
docstring is the reference for what it does; this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from gptrain.config.exp_manager_schema import ExpManagerConfig
from gptrain.config.yamlio import dump_config

PER_SPLIT_KEYS = ("train", "validation", "test")
"""The keys of data_prefix's per-split form (NeMo's; Megatron's --train/--valid/--test-data-path), in
split order. The config names them; the dataset builder reads the splits in this order."""


@dataclass
class RunConfig:
    name: str = "gpt3_126m"
    """Run name: the run directory under base_results_dir and the Slurm job name."""
    results_dir: str = "results/gpt3_126m"
    """Directory of this run (NeMo: `${base_results_dir}/${.name}`)."""
    time_limit: str | None = None
    """Slurm time limit of one job (`D-HH:MM:SS`); used by the launcher."""
    dependency: str | None = None
    """Slurm dependency of the job (e.g. `singleton`); used by the launcher."""


@dataclass
class TrainerConfig:
    num_nodes: int = 1
    """Nodes used by the run."""
    devices: int = 1
    """Processes (GPUs, or CPU processes with gloo) per node."""
    accelerator: str = "auto"
    """`gpu`, `cpu`, or `auto` (gpu when CUDA is present)."""
    precision: str = "bf16"
    """`32`, `16` (fp16 with dynamic loss scaling) or `bf16` (also `16-mixed`, `bf16-mixed`)."""
    max_steps: int = 600000
    """Optimizer steps to train for; consumed samples = steps x global batch size."""
    train_samples: int | None = None
    """gptrain extension, Megatron's --train-samples: the train split's indices are built for this
    many samples, as Megatron builds them, instead of max_steps x global batch size (the two differ
    under a batch-size ramp-up, and in the epochs and shuffle that follow from the count).
    max_steps still ends the run; `gptrain megatron` sets both. Inside a ramp max_steps can read more
    than this; a split that then holds fewer is built for what they read, said in one line."""
    max_time: str | None = None
    """Wall-clock limit `DD:HH:MM:SS` per job: checkpoint and exit for a requeue when reached; null: none
    (zero is refused: each job would train one step)."""
    exit_interval: int | None = None
    """gptrain extension, Megatron's --exit-interval: at every multiple of N steps before max_steps,
    save a checkpoint (when checkpoints are on) and exit 0, with no validation or test split beyond
    those due there; the schedule still runs to max_steps, and the same command resumes. null: none."""
    log_every_n_steps: int = 10
    """Print Megatron's iteration line every N steps (and on the first)."""
    tensorboard_log_interval: int | None = None
    """gptrain extension, Megatron's --tensorboard-log-interval: TensorBoard and W&B get every N-th
    iteration's own loss, learning rate, grad norm and loss scale (timing stays with the printed
    line), also where N equals log_every_n_steps. null: the printed line's values, the loss its mean
    over the interval. Each point costs host time for its writes (1: every step's), no device sync."""
    log_memory_interval: int | None = None
    """gptrain extension, Megatron's --log-memory-interval: each rank's memory report (allocated,
    reserved and their peaks, on GPUs) every N iterations, beside the one at the end. null: at the end."""
    log_throughput: bool = True
    """gptrain extension, Megatron's --log-throughput: the iteration line's `throughput per GPU
    (TFLOP/s/GPU)` field, after the time per iteration. `gptrain megatron` leaves it out unless the
    flag is given, as Megatron does, so that its line has Megatron's fields in Megatron's places."""
    val_check_interval: int = 2000
    """Validate every N steps (and at the end)."""
    limit_val_batches: int = 50
    """Global batches per validation; 0 disables validation (benchmark mode)."""
    limit_test_batches: int = 50
    """Global batches of the test split evaluated at the end; 0 disables it."""
    gradient_clip_val: float | None = 1.0
    """Clip the global gradient norm to this value; 0 or null disables clipping."""
    max_consecutive_nonfinite: int = 5
    """gptrain extension: stop after this many non-finite iterations in a row."""
    hang_timeout_minutes: float = 10.0
    """gptrain extension: a rank whose training step (or global batch of a validation or test split)
    makes no progress for this long (5 times this for its first step and first evaluated batch) ends
    the job with exit 76, naming the stuck rank and host; 0 disables the watchdog. A checkpoint save
    gets 5 times this, or its state's bytes at 25 MB/s a rank where longer, below the process group's
    timeout (gptrain.train.saving.save_allowance_s)."""
    run_ahead: bool = True
    """gptrain extension: queue the next step's forward/backward before reading a step's loss and
    grad norm, where the update needs no host decision (fused AdamW on the GPU, bf16/fp32, no FSDP2
    or TP), so the GPU is not idle while the host bookkeeps; the same steps in the same order."""

    def resolved_accelerator(self) -> str:
        """`gpu` or `cpu`; `auto` becomes gpu iff CUDA is available (imports torch)."""
        if self.accelerator != "auto":
            return self.accelerator
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"

    def max_time_seconds(self) -> float | None:
        if not self.max_time:
            return None
        parts = [float(p) for p in str(self.max_time).split(":")]
        units = [86400, 3600, 60, 1][-len(parts) :]
        return sum(p * u for p, u in zip(parts, units, strict=True))


@dataclass
class TokenizerConfig:
    library: str = "megatron"
    """Tokenizer family (NeMo: `megatron`, `huggingface`, `tiktoken`, `sentencepiece`: `model` is a
    SentencePiece tokenizer.model, encoded as GPTSentencePieceTokenizer whatever `type` says)."""
    type: str | None = "GPT2BPETokenizer"
    """`GPT2BPETokenizer` (vocab_file + merge_file), `HuggingFaceTokenizer`, `TikTokenizer`, or
    Megatron's SentencePiece types `GPTSentencePieceTokenizer`, `Llama2Tokenizer`,
    `SentencePieceTokenizer` (`model` a tokenizer.model; the sentencepiece package), by any spelling
    data prepare's --tokenizer-type takes (gptrain.utils.tokenizer_types). null only with library
    sentencepiece, as NeMo's configs write it."""
    model: str | None = None
    """A tokenizer.json path (HuggingFaceTokenizer), a SentencePiece tokenizer.model, or for
    TikTokenizer Megatron's tiktoken vocabulary file (a .json list of rank, token_bytes, token_str)
    or a tiktoken encoding name (cl100k_base)."""
    vocab_file: str | None = None
    """GPT-2 BPE vocab.json."""
    merge_file: str | None = None
    """GPT-2 BPE merges.txt."""
    legacy: bool = False
    """gptrain extension, Megatron's --legacy-tokenizer: GPT-2 BPE keeps a literal <|endoftext|> in
    the text as text (as data prepared with the flag has it); training refuses data whose recorded
    setting differs (`<prefix>.tokenizer`), as exp_manager.allow_tokenizer_change allows."""
    use_fast: bool | None = None
    """NeMo's AutoTokenizer switch. gptrain encodes with the fast tokenizer; false is taken where
    transformers' slow one gives the same ids (GPT2BPETokenizer; a tokenizer.json whose
    tokenizer_config.json names GPT2Tokenizer or a ...Fast class, which transformers loads as named) and refused elsewhere for
    HuggingFaceTokenizer (a slow LlamaTokenizer encodes otherwise); other types do not read it."""
    vocab_size: int | None = None
    """TikTokenizer with a vocabulary file (Megatron's --vocab-size): the ids, special tokens first,
    then the file's first ranks; null is 131072 (2**17), Megatron's default. NullTokenizer (data
    already tokenized, no files): its ids, 0 to vocab_size - 1 (required)."""
    null_eod_id: int | None = None
    """NullTokenizer (Megatron's --null-tokenizer-eod-id): the end-of-document id, which
    model.data.eod_mask_loss masks; null is vocab_size - 1, as Megatron core 0.18 on."""
    null_pad_id: int | None = None
    """NullTokenizer (Megatron's --null-tokenizer-pad-id): labels of this id stay out of the loss and
    its tokens read as id 0, as Megatron's GPT dataset does with padding; null (or -1) is none."""
    tiktoken_pattern: str | None = None
    """TikTokenizer with a vocabulary file: Megatron's pre-tokenizer split `v1` or `v2` (null: v2,
    Megatron's default)."""
    tiktoken_num_special_tokens: int = 1000
    """TikTokenizer with a vocabulary file: the ids before the file's ranks, each a special token
    (`special_tokens`, then <SPECIAL_i> fillers), as Megatron's --tiktoken-num-special-tokens."""
    special_tokens: list[str] | None = None
    """TikTokenizer with a vocabulary file: Megatron's --tokenizer-special-tokens, ids 0, 1, ...;
    must hold <unk> <s> </s> <mask> <pad> <cls> <sep> (null: those, in that order); </s> ends
    documents."""


DEFAULT_MIN_LR = {"SquareAnnealing": 1e-5}
"""NeMo's min_lr where a config leaves it out and it is not 0 (NeMo passes only the keys given)."""


def default_min_lr(schedule: str) -> float:
    return DEFAULT_MIN_LR.get(schedule, 0.0)


@dataclass
class SchedConfig:
    name: str = "CosineAnnealing"
    """`CosineAnnealing`, `LinearAnnealing` or `Constant`, with linear warmup; or one of NeMo's
    `WarmupPolicy`, `WarmupHoldPolicy`, `WarmupAnnealing`, `SquareAnnealing`, `SquareRootAnnealing`,
    `InverseSquareRootAnnealing`, `PolynomialDecayAnnealing`, `PolynomialHoldDecayAnnealing`,
    `WarmupHoldAnnealLinear`, `WarmupHoldAnnealOneMinusSquareRoot`, `NoamAnnealing`,
    `NoamHoldAnnealing` (nemo/core/optim/lr_scheduler.py, the same rates at every step); or Megatron's
    `MegatronInverseSquareRoot` and `WarmupStableDecay` (its --lr-decay-style inverse-square-root and WSD,
    gptrain.train.megatron_schedules)."""
    warmup_steps: int | None = 0
    """Steps of linear warmup to optim.lr (see warmup_style for where it starts); null is 0, as
    NeMo reads it (NeMo configs write null next to warmup_ratio)."""
    warmup_init_lr: float = 0.0
    """gptrain extension, Megatron's --lr-warmup-init: the rate the linear warmup starts from,
    init + (lr - init) x step / warmup_steps; not with NeMo's CosineAnnealing warmup (warmup_style)."""
    constant_steps: int | None = 0
    """Steps held at min_lr at the end of the schedule; null is 0, as NeMo reads it."""
    constant_ratio: float | None = None
    """NeMo: int(constant_ratio x schedule length) constant steps (instead of a non-zero
    constant_steps: a 0 counts as absent, as warmup_steps' does beside warmup_ratio)."""
    warmup_style: str = "nemo"
    """`nemo`: CosineAnnealing with constant_steps 0 and NeMo's WarmupPolicy schedules (all but
    CosineAnnealing, LinearAnnealing, Constant, NoamAnnealing and Megatron's two) warm up as NeMo's, lr x
    (step + 1) / (warmup_steps + 1); CosineAnnealing with constant steps, LinearAnnealing, Constant and
    Megatron's two linearly from warmup_init_lr (0, as NeMo); NoamAnnealing by its own formula.
    `megatron` (what `gptrain megatron` sets): linearly from warmup_init_lr for every schedule but
    NoamAnnealing, which refuses it, as --lr-warmup-iters."""
    min_lr: float | None = None
    """Learning rate at the end of the decay; null (or absent) is the schedule's NeMo default,
    1e-5 for SquareAnnealing and 0 for every other (DEFAULT_MIN_LR)."""
    max_steps: int | None = None
    """Length of the schedule; null means trainer.max_steps."""
    warmup_ratio: float | None = None
    """NeMo: warmup of int(warmup_ratio x schedule length) steps (instead of warmup_steps)."""
    warmup_samples: int | None = None
    """Megatron's --lr-warmup-samples: warmup over this many samples (instead of warmup_steps)."""
    decay_samples: int | None = None
    """Megatron's --lr-decay-samples: schedule length in samples (instead of max_steps)."""
    warmup_fraction: float | None = None
    """Megatron's --lr-warmup-fraction: warmup over this fraction of the schedule length."""
    hold_steps: int | None = None
    """NeMo's WarmupHoldPolicy family: steps held at optim.lr after the warmup (null: no hold, and
    NeMo's hold-relative decays then count from step 0)."""
    hold_ratio: float | None = None
    """NeMo: int(hold_ratio x schedule length) hold steps (instead of hold_steps)."""
    d_model: int | None = None
    """NoamAnnealing: the rate is scaled by d_model ** -0.5; null is model.hidden_size."""
    power: float | None = None
    """PolynomialDecayAnnealing, PolynomialHoldDecayAnnealing: the decay's exponent (null: 1.0; 0
    holds lr to max_steps, as NeMo)."""
    cycle: bool | None = None
    """PolynomialDecayAnnealing, PolynomialHoldDecayAnnealing: NeMo's cycle (null: false)."""
    decay_rate: float | None = None
    """NoamHoldAnnealing: the exponent of its decay after the hold (null: 0.5, Noam's; 0 holds lr to
    max_steps, as NeMo)."""
    from_checkpoint: bool = False
    """gptrain extension, Megatron's --use-checkpoint-opt_param-scheduler: a resume takes the schedule's
    name, lr, min_lr, warmup and length the checkpoint records over this config's (said in the log);
    false: this config's apply (a change said in the log)."""
    wsd_decay_steps: int | None = None
    """WarmupStableDecay (Megatron's WSD, --lr-wsd-decay-iters): lr is held until this many steps before
    the schedule's end, then annealed to min_lr; it needs this or wsd_decay_samples."""
    wsd_decay_samples: int | None = None
    """WarmupStableDecay (--lr-wsd-decay-samples): the annealing in samples (instead of wsd_decay_steps)."""
    wsd_decay_style: str | None = None
    """WarmupStableDecay (--lr-wsd-decay-style): the annealing's shape, `linear`, `cosine`, `exponential`
    or `minus_sqrt`; null is `exponential`, Megatron's default."""


@dataclass
class OptimConfig:
    name: str = "adamw"
    """AdamW; NeMo's `distributed_fused_adam`, `fused_adam`, `mcore_distributed_optim` map to it."""
    lr: float = 6e-4
    """Peak learning rate."""
    weight_decay: float = 0.1
    """Decoupled weight decay (not applied to biases and norm weights)."""
    weight_decay_incr_style: str = "constant"
    """gptrain extension, Megatron's --weight-decay-incr-style: `constant` (weight_decay throughout), or
    `linear` / `cosine` from start_weight_decay to end_weight_decay over the run (trainer.max_steps, or
    trainer.train_samples), as Megatron's get_wd; weight_decay is then unused."""
    start_weight_decay: float | None = None
    """The increment's weight decay at the first step (Megatron's --start-weight-decay)."""
    end_weight_decay: float | None = None
    """The increment's weight decay at the run's end, at least start_weight_decay (--end-weight-decay)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    sched: SchedConfig = field(default_factory=SchedConfig)


@dataclass
class DataConfig:
    data_impl: str = "mmap"
    """`mmap` reads Megatron .bin/.idx datasets; `mock` generates random tokens (benchmarks)."""
    data_prefix: Any = None
    """One dataset prefix, or a blend `[w1, prefix1, w2, prefix2, ...]`, or per split
    `{train: ..., validation: ..., test: ...}` (each a prefix or a blend; all of its documents in that split)."""
    splits_string: str = "99990,8,2"
    """Train, validation, test split of the documents (Megatron's `--split`)."""
    seq_length: int = 2048
    """Tokens per sample (NeMo keeps it equal to encoder_seq_length)."""
    index_mapping_dir: str | None = None
    """Where sample/shuffle index caches go (default: next to each dataset)."""
    mid_level_dataset_surplus: float = 0.005
    """Megatron's --mid-level-dataset-surplus: each dataset of a blend builds this fraction more samples
    than its share (Megatron's default 0.005); a different value gives other samples, as in Megatron."""
    num_workers: int = 2
    """DataLoader worker processes per rank."""
    eod_mask_loss: bool = False
    """Exclude end-of-document tokens from the loss."""
    allow_ambiguous_pad_tokens: bool = False
    """Megatron's --allow-ambiguous-pad-tokens: NullTokenizer's null_pad_id (or a HuggingFaceTokenizer's
    tokenizer_config.json pad_token) equal to its end of document is still padding (its labels leave
    the loss, it reads as id 0). false (Megatron's default): such an id is no padding, with a
    warning, as Megatron core 0.18's GPT dataset resets it."""
    token_scan_limit_gb: float | None = None
    """gptrain extension, NullTokenizer only: the most GiB of .bin files (all of the data in all)
    read at the start for their largest token id, so that an id past vocab_size stops the run before
    its first step; read once, the result kept beside the index caches. A larger corpus is checked
    as each sample is read, which finds such an id only when a batch holds it. null: 4; 0: read
    nothing at the start. Rank 0 reads 1-2 GB/s from a parallel file system while the other ranks
    wait (a read longer than the process group's timeout stops the run)."""
    mock_dataset: bool = False
    """NeMo's switch for the mock dataset; true is the same as data_impl=mock."""
    mock_vocab_size: int | None = None
    """gptrain extension: vocabulary of the mock dataset when no tokenizer files are given."""

    def is_mock(self) -> bool:
        return self.data_impl == "mock" or bool(self.mock_dataset)

    def builds_tokenizer(self) -> bool:
        """Only mock data with mock_vocab_size trains without a tokenizer; anything else reads its
        files (the launcher's preflight checks them by this same rule)."""
        return not (self.is_mock() and self.mock_vocab_size)


@dataclass
class ModelConfig:
    micro_batch_size: int = 4
    """Samples per forward/backward on one data-parallel rank."""
    global_batch_size: int = 256
    """Samples per optimizer step over all data-parallel ranks."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree (heads and MLP split over ranks)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel degree (layers split over ranks)."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Model chunks per pipeline rank for the interleaved 1F1B schedule."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Transformer layers of the first pipeline stage (NeMo 2's key, Megatron's
    --decoder-first-pipeline-num-layers): a stage that also holds the embedding may take fewer.
    The layers the first and last stage leave are split evenly over the stages between; with
    virtual stages each rank's layers split evenly over its chunks. null: an equal share."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Transformer layers of the last pipeline stage, which also holds the output layer and loss
    (Megatron's --decoder-last-pipeline-num-layers); null: as the first key says."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer in an even pipeline split: the first stage builds one layer
    fewer (Megatron's --account-for-embedding-in-pipeline-split; not with the two keys above)."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the output layer and loss as one layer in an even pipeline split: the last stage
    builds one layer fewer (Megatron's --account-for-loss-in-pipeline-split)."""
    sequence_parallel: bool = False
    """Shard norms and dropout along the sequence over the tensor-parallel ranks."""
    data_parallel_sharding: str | None = None
    """gptrain extension: `ddp` (replicated), `shard_grad_op` (AdamW state and gradients sharded,
    weights gathered once per step: ZeRO-2, what NeMo's distributed_fused_adam and Megatron's
    distributed optimizer do), `full_shard` (FSDP2/ZeRO-3), `hybrid_shard` (shard in node). null:
    `shard_grad_op` where model.optim.name is a distributed optimizer, else `ddp`."""
    fsdp: bool = False
    """NeMo's FSDP switch: true means data_parallel_sharding by fsdp_sharding_strategy."""
    fsdp_sharding_strategy: str = "full"
    """NeMo's FSDP strategy with fsdp=true: `full` (full_shard), `hybrid` (hybrid_shard) or `grad`
    (shard_grad_op)."""
    activations_checkpoint_granularity: str | None = None
    """`full` (recompute whole layers), `selective` (recompute attention core) or null."""
    activations_checkpoint_method: str | None = None
    """`uniform` or `block`, for full granularity."""
    activations_checkpoint_num_layers: int | None = None
    """Layers per checkpointed group (uniform) or checkpointed layers per stage (block)."""
    encoder_seq_length: int = 2048
    """Sequence length of the model."""
    max_position_embeddings: int | None = None
    """Rows of the learned position table (at least encoder_seq_length); with rope, the context the
    model is declared for (export, generate); null: encoder_seq_length."""
    num_layers: int = 12
    """Transformer layers."""
    hidden_size: int = 768
    """Model width."""
    ffn_hidden_size: int | None = None
    """MLP width; null means 4 x hidden_size."""
    num_attention_heads: int = 12
    """Attention heads."""
    num_query_groups: int | None = None
    """Key/value head groups for grouped-query attention; null means multi-head attention."""
    kv_channels: int | None = None
    """Head dimension; null means hidden_size / num_attention_heads."""
    init_method_std: float = 0.02
    """Standard deviation of the normal weight initialisation."""
    use_scaled_init_method: bool = True
    """Scale output-projection init by 1/sqrt(2 x num_layers) as Megatron does."""
    hidden_dropout: float = 0.1
    """Dropout on attention and MLP outputs."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of the norms."""
    normalization: str = "layernorm"
    """`layernorm`, `layernorm1p` (zero-centred gamma, same function) or `rmsnorm`."""
    bias: bool = True
    """Biases in linear layers and norms."""
    activation: str = "gelu"
    """`gelu`, or `swiglu`/`fast-swiglu` (gated, with ffn_hidden_size as the gate width)."""
    openai_gelu: bool = False
    """GELU's tanh approximation (GPT-2's `gelu_new`), as Megatron's --openai-gelu; set by
    bias_activation_fusion too (the loaded config shows the GELU that runs)."""
    bias_activation_fusion: bool = True
    """NeMo's and Megatron's fused bias-GELU, on in both by default, computes GELU's tanh approximation:
    with `activation: gelu` and `bias: true` it makes openai_gelu true; false keeps the erf GELU
    (Megatron's --no-bias-gelu-fusion). Without biases Megatron turns the fusion off: erf."""
    position_embedding_type: str = "learned_absolute"
    """`learned_absolute` or `rope`."""
    rotary_percentage: float = 1.0
    """Fraction of the head dimension rotated by rope."""
    rotary_base: int = 10000
    """Rope base frequency."""
    share_embeddings_and_output_weights: bool = True
    """Tie the output projection to the input embedding."""
    make_vocab_size_divisible_by: int = 128
    """Pad the vocabulary to a multiple of this x tensor_model_parallel_size."""
    padded_vocab_size: int | None = None
    """Megatron's --padded-vocab-size: the embedding's rows, the same at any tensor_model_parallel_size
    (a multiple of it), so a resume under another TP keeps them; null pads the vocabulary by
    make_vocab_size_divisible_by. A tokenizer with more ids is refused at the start."""
    seed: int = 1234
    """Seed of initialisation, dropout and data shuffling."""
    native_amp_init_scale: float = 2.0**32
    """Initial loss scale for fp16 (with native_amp_static_scale, the scale throughout: at most 2**24)."""
    native_amp_growth_interval: int = 1000
    """Steps without overflow before the fp16 loss scale doubles."""
    hysteresis: int = 2
    """Overflowing steps tolerated before the fp16 loss scale is halved."""
    native_amp_static_scale: bool = False
    """gptrain extension, Megatron's --loss-scale: fp16 keeps native_amp_init_scale for the whole run,
    neither growing nor backing off (native_amp_growth_interval and hysteresis unused); an overflowing
    step is skipped and counts towards trainer.max_consecutive_nonfinite. A resume keeps the configured
    scale, not the checkpoint's."""
    resume_from_checkpoint: str | None = None
    """NeMo's other spelling of exp_manager.resume_from_checkpoint (give one of the two)."""
    restore_from_ckpt: str | None = None
    """NeMo's megatron_gpt_config.yaml continual training: exp_manager.resume_from_checkpoint with
    exp_manager.load_data_position=false (weights, optimizer, iteration and schedule go on; the data
    starts at its first sample, as NeMo's continue_training sets consumed samples to 0)."""
    rampup_batch_size: list[int] | None = None
    """[start, increment, samples]: the global batch grows from start by increment until it reaches
    global_batch_size after `samples` consumed samples (Megatron's --rampup-batch-size)."""
    compile: bool = False
    """gptrain extension: torch.compile the model. One device and DDP compile the whole forward and
    loss as one graph; FSDP compiles each block and the loss; TP and PP compile each block."""
    compile_mode: str = "default"
    """gptrain extension: torch.compile mode (default, max-autotune, max-autotune-no-cudagraphs,
    reduce-overhead); see docs/performance.md for what each measured."""
    fp8: bool = False
    """FP8 matmuls in the transformer blocks (torchao float8 training; needs a Hopper or Ada GPU).
    The output projection stays in the training precision."""
    fp8_recipe: str = "tensorwise"
    """gptrain extension: torchao float8 scaling recipe, tensorwise or rowwise."""
    fp8_emulate: bool = False
    """gptrain extension: torchao's emulated float8 matmuls (torchtitan's `float8.emulate`): the same
    casts and scales in higher-precision matmuls, on any device; for checking FP8 numerics where no
    FP8 tensor cores are (bench/fp8_curve.py --emulate), never for speed."""
    fp8_fsdp_all_gather: bool = True
    """gptrain extension: under FSDP with tensorwise FP8, all-gather the block weights already cast
    to float8 (half the bytes of bf16; torchao's float8 all-gather, with all scales computed in one
    all-reduce after each optimizer step). Off: gather in the training precision, cast after."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class TrainingConfig:
    run: RunConfig = field(default_factory=RunConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    exp_manager: ExpManagerConfig = field(default_factory=ExpManagerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ignored_keys: list[str] = field(default_factory=list, repr=False)
    """NeMo keys that were given but that gptrain does not implement (reported once)."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("ignored_keys")
        return data

    def to_yaml(self) -> str:
        return dump_config(self.to_dict())

    def world_size(self) -> int:
        return self.trainer.num_nodes * self.trainer.devices

    def results_path(self, *parts: str) -> str:
        return os.path.join(self.exp_manager.explicit_log_dir, *parts)
