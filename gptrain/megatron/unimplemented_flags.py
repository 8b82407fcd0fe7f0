"""The flags of Megatron-LM's parser that gptrain does not take, so that an unknown flag is told apart
from a typo: a Megatron flag is refused as one gptrain does not implement, with no "did you mean" hint
(difflib's nearest gptrain flag is a different one: --eval-micro-batch-size is not --micro-batch-size,
and that flag given twice, the later wins). Megatron's deprecated spellings name their successor."""

from __future__ import annotations

# Names Megatron still defines but its validate_args refuses, naming their successor (arguments.py).
RENAMED: dict[str, str] = {
    "--batch-size": "--micro-batch-size",
    "--model-parallel-size": "--tensor-model-parallel-size",
    "--warmup": "--lr-warmup-fraction",
}

# Megatron-LM d98e8a64 (2026-08-22): the options of add_megatron_arguments (878 with -h/--help), less
# gptrain's flag tables, RENAMED, --help and the --moe-* flags (refused as --num-experts). A flag taken
# into a table leaves this list (test_megatrons_unimplemented_flags_are_not_in_the_tables).
NOT_IMPLEMENTED: frozenset[str] = frozenset(
    """
    --activation-func-clamp-value --activation-offload-fraction --adlr-autoresume --adlr-autoresume-interval
    --app-tag-run-name --app-tag-run-version --apply-wd-to-qk-layernorm --async-ckpt-cpu-priority
    --async-ckpt-io-priority --async-ckpt-use-cpu-shm --async-strategy --attention-output-gate
    --batch-invariant-backend --batch-invariant-mode --bert-embedder-type --bert-load --bert-no-binary-head
    --biencoder-projection-dim --biencoder-shared-query-context-model --block-data-path --cache-mla-latents
    --calc-ft-timeouts --check-for-large-grads --check-for-spiky-loss
    --check-weight-hash-across-dp-replicas-interval --ckpt-convert-format --ckpt-convert-save
    --ckpt-convert-update-legacy-dist-opt-format --ckpt-drop-redundant-extra-state
    --ckpt-fully-parallel-load-exchange-algo --ckpt-fully-parallel-load-per-rank-objects
    --ckpt-fully-parallel-load-process-group --ckpt-fully-parallel-save-process-group
    --ckpt-pg-tensors-cache-create --ckpt-pg-tensors-cache-path --ckpt-step --classes-fraction
    --config-logger-dir --cp-comm-type --cpu-offloading-num-layers
    --cpu-offloading-retain-pinned-cpu-buffers --create-all-gather-group --cuda-graph-impl
    --cuda-graph-modules --cuda-graph-scope --cuda-graph-warmup-steps --data-parallel-random-init
    --data-per-class-fraction --dataloader-inter-document-masking
    --ddp-param-name-patterns-for-fp32-local-accumulation --ddp-reduce-scatter-with-fp32-accumulation
    --decode-only-cuda-graphs --decoder-num-layers --decoder-seq-length --decrease-batch-size-if-needed
    --defer-embedding-wgrad-compute --delay-offload-until-cuda-graph --delay-wgrad-compute
    --delta-offload-bytes-across-pp-ranks --dino-bottleneck-size --dino-freeze-last-layer
    --dino-head-hidden-size --dino-local-crops-number --dino-local-img-size --dino-norm-last-layer
    --dino-teacher-temp --dino-warmup-teacher-temp --dino-warmup-teacher-temp-epochs
    --disable-align-grad-reduce --disable-bf16-reduced-precision-matmul
    --disable-ckpt-load-validate-sharding-integrity --disable-clone-scatter-output-in-embedding
    --disable-dsa-indexer-rotate-activation --disable-dsa-indexer-scoring-relu
    --disable-flight-recorder-dump-on-timeout --disable-flight-recorder-extra-dump-on-exec
    --disable-flight-recorder-include-only-active --disable-fp8-wgrad --disable-gloo-process-groups
    --disable-jit-fuser --disable-mamba-mem-eff-path --disable-msc --disable-save-tokenizer-assets
    --disable-strict-fsdp-dtensor-load --disable-symmetric-registration --disable-tp-comm-bulk-dgrad
    --disable-tp-comm-bulk-wgrad --disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs
    --disable-tp-comm-split-ag --disable-tp-comm-split-rs --disable-use-tokenizer-model-from-checkpoint-args
    --dist-ckpt-save-pre-mcore-014
    --distributed-timeout-seconds-after-init --dsa-indexer-head-dim --dsa-indexer-k-norm-epsilon
    --dsa-indexer-k-norm-fp32 --dsa-indexer-loss-coeff --dsa-indexer-n-heads --dsa-indexer-rope-interleaved
    --dsa-indexer-skip-topk-offset --dsa-indexer-topk --dsa-indexer-topk-freq --dsa-indexer-use-sparse-loss
    --dsa-kernel-backend --dump-param-to-param-group-map --embedding-init-method-std --embedding-path
    --enable-chunked-prefill --enable-cuda-graph --enable-experimental --enable-ft-package
    --enable-full-sharding-in-hsdp --enable-mhc-connections --enable-msc --encoder-num-layers
    --encoder-seq-length --ep-overlap-early-attn-memory-release --error-injection-rate
    --error-injection-type --eval-global-batch-size --eval-micro-batch-size --evidence-data-path
    --exit-on-missing-checkpoint --exit-signal --exit-signal-handler-for-dataloader
    --exit-signal-handler-for-training --experimental-attention-variant
    --expert-tensor-parallel-num-weight-shards --external-cuda-graph --fake-process-group
    --fault-injector-delay-start-iteration --fault-injector-fault-delay --fault-injector-fault-probabilities
    --fault-injector-fault-types --fault-injector-mtti-seconds --fault-injector-num-ranks
    --fault-injector-offset-seconds --fault-injector-ranks --fault-injector-seed --fim-data --fim-eod-token
    --fim-fragment-rate --fim-middle-token --fim-no-prefix --fim-pad-token --fim-prefix-token --fim-rate
    --fim-split-sample --fim-spm-rate --fim-suffix-token --fine-grained-activation-offloading
    --fine-grained-offloading-max-inflight-offloads --first-last-layers-bf16 --flash-attention-version
    --flash-decode --flight-recorder-dump-path --flight-recorder-include-stack-trace
    --flight-recorder-trace-buffer-size --fp32-residual-connection --fp4-format --fp4-param-gather
    --fp4-quantizer-factory --fp4-recipe --fp8-output-proj --fp8-quantizer-factory --freeze-all-layers
    --fsdp-db-use-persist-buf-on-alloc-fail --ft-num-warmup-iters --full-validation --fused-residual-rmsnorm
    --gdp-cutedsl-kernel --gdp-num-chunk-states-to-recompute --gdp-num-householder --glu-linear-offset
    --gpu-sniff-test-interval --grpo-clamp-eps-lower --grpo-clamp-eps-upper --grpo-entropy-term-weight
    --grpo-filter-groups-with-same-reward --grpo-group-size --grpo-iterations --grpo-kl-beta
    --grpo-prompts-per-step --gtp-expert-remat-nccl-ub --gtp-remat-nccl-ub --gtp-remat-opt-in-modules
    --gtp-remat-reduce-scatter-with-fp32-accumulation --head-lr-mult
    --heterogeneous-layers-config-encoded-json --heterogeneous-layers-config-path
    --hierarchical-context-parallel-sizes --high-priority-a2a-comm-stream --high-priority-stream-groups
    --hybrid-context-parallel --hybrid-layer-pattern --hybrid-override-pattern --ict-head-size --ict-load
    --img-h --img-w --indexer-batch-size --indexer-log-interval --inference-batch-times-seqlen-threshold
    --inference-coordinator-port --inference-cuda-graph-all-prefills --inference-cuda-graph-max-tokens
    --inference-cuda-graph-scope --inference-disable-ep-consensus --inference-disable-triton-nvls-kernels
    --inference-dynamic-batching --inference-dynamic-batching-async-sched-mode
    --inference-dynamic-batching-block-size --inference-dynamic-batching-buffer-size-gb
    --inference-dynamic-batching-cuda-graph-mixed-prefill-count
    --inference-dynamic-batching-cuda-graph-sizing-distribution --inference-dynamic-batching-logprobs-mode
    --inference-dynamic-batching-mamba-memory-ratio --inference-dynamic-batching-max-requests
    --inference-dynamic-batching-max-tokens --inference-dynamic-batching-num-cuda-graphs
    --inference-dynamic-batching-paused-buffer-size-gb --inference-dynamic-batching-prefix-caching
    --inference-dynamic-batching-prefix-caching-coordinator-policy
    --inference-dynamic-batching-prefix-caching-eviction-policy
    --inference-dynamic-batching-prefix-caching-mamba-gb
    --inference-dynamic-batching-prefix-caching-routing-alpha --inference-dynamic-batching-sampling-backend
    --inference-dynamic-batching-track-generated-token-events
    --inference-dynamic-batching-track-paused-request-events
    --inference-dynamic-batching-unified-memory-level --inference-fuse-tp-communication
    --inference-grouped-gemm-backend --inference-logging-step-interval --inference-max-requests
    --inference-max-seq-length --inference-moe-disable-fused-quant-kernels
    --inference-moe-token-dispatcher-type --inference-rng-tracker --inference-shards
    --inference-text-gen-server-logging --inference-use-synchronous-zmq-collectives
    --inference-wandb-logging --inprocess-active-world-size --inprocess-barrier-timeout
    --inprocess-completion-timeout --inprocess-empty-cuda-cache --inprocess-granularity
    --inprocess-hard-timeout --inprocess-heartbeat-interval --inprocess-heartbeat-timeout
    --inprocess-last-call-wait --inprocess-max-iterations --inprocess-monitor-process-interval
    --inprocess-monitor-thread-interval --inprocess-progress-watchdog-interval --inprocess-restart
    --inprocess-soft-timeout --inprocess-termination-grace-time --is-hybrid-model --iter-per-epoch
    --iterations-to-skip --keep-fp8-transpose-cache --kitchen-attention-backend --kv-lora-rank
    --langrl-env-config --lazy-mpu-init --linear-attention-freq --linear-conv-kernel-dim
    --linear-key-head-dim --linear-num-key-heads --linear-num-value-heads --linear-value-head-dim
    --lion-beta1 --lion-beta2 --load-main-params-from-ckpt --local-rank --logits-load-decode-threads
    --logits-load-dir --logits-load-ignore-errors --logits-load-kd-loss-alpha
    --logits-load-msc-prefetch-depth --logits-load-prefetch-factor --logits-save-dir --logits-save-dtype
    --logits-save-top-k --logits-save-top-p --logits-save-top-p-min-k --mamba-head-dim
    --mamba-inference-conv-states-dtype --mamba-inference-ssm-states-dtype --mamba-num-groups
    --mamba-num-heads --mamba-state-dim --mamba-training-ssm-states-dtype --mask-factor --mask-prob
    --mask-type --max-seqlen-per-dp-cp-rank --max-tokens-to-oom
    --megatron-fsdp-enable-fine-grained-param-gather --megatron-fsdp-grad-comm-dtype
    --megatron-fsdp-main-grads-dtype --megatron-fsdp-main-params-dtype
    --megatron-fsdp-max-pool-double-buffer --megatron-fsdp-version --mhc-init-gating-factor
    --mhc-num-residual-streams --mhc-recompute-layer-num --mhc-sinkhorn-iterations
    --microbatch-group-size-per-virtual-pipeline-stage --min-offloaded-tensor-size --mla-down-proj-fusion
    --mlp-chunks-for-prefill --mlp-chunks-for-training --mrope-section --mscale --mscale-all-dim
    --mtp-detach-heads --mtp-hsm --mtp-hybrid-override-pattern --mtp-loss-scaling-factor --mtp-standalone
    --mtp-use-repeated-layer --multiple-validation-sets --muon-coefficient-type --muon-extra-scale-factor
    --muon-fp32-matmul-prec --muon-momentum --muon-nesterov --muon-no-split-qkv --muon-num-ns-steps
    --muon-scalar-optimizer --muon-scale-mode --muon-tp-mode --muon-use-syrk --mup-attn-scale-power
    --mup-base-head-dim --mup-base-hidden-size --mup-embedding-mult --mup-output-mult --mup-width-mult
    --nccl-all-reduce-for-prefill --nccl-communicator-config-path --no-align-grad-reduce
    --no-align-param-gather --no-ckpt-load-validate-sharding-integrity
    --no-clone-scatter-output-in-embedding --no-data-sharding --no-dsa-indexer-rotate-activation
    --no-dsa-indexer-scoring-relu --no-flight-recorder-dump-on-timeout
    --no-flight-recorder-extra-dump-on-exec --no-flight-recorder-include-only-active --no-fp8-wgrad
    --no-inference-disable-ep-consensus --no-inference-dynamic-batching-prefix-caching
    --no-inference-text-gen-server-logging --no-inference-use-synchronous-zmq-collectives
    --no-inference-wandb-logging --no-initialization --no-one-logger --no-overlap-p2p-communication
    --no-pin-cpu-grads --no-pin-cpu-params --no-rl-inference-logprobs-is-correction
    --no-rl-offload-inference-model-weights-when-idle --no-rl-partial-rollouts --no-rl-persist-cuda-graphs
    --no-rl-skip-bos-token --no-rl-training-cuda-graphs --no-rl-use-sequence-packing
    --no-rl-verify-model-weights-swap --no-save-tokenizer-assets --no-strict-fsdp-dtensor-load
    --no-tp-comm-bulk-dgrad --no-tp-comm-bulk-wgrad --no-tp-comm-overlap-ag --no-tp-comm-overlap-rs
    --no-tp-comm-split-ag --no-tp-comm-split-rs --no-use-layer-wise-param-layout
    --no-use-tokenizer-model-from-checkpoint-args --no-weight-decay-cond-type
    --no-yarn-correction-range-round-to-int --non-persistent-ckpt-type --non-persistent-global-ckpt-dir
    --non-persistent-local-ckpt-algo --non-persistent-local-ckpt-dir --num-channels --num-classes
    --num-distributed-optimizer-instances --num-layers-at-end-in-bf16 --num-layers-at-start-in-bf16
    --num-speculative-tokens --object-storage-cache-path --offload-modules --one-logger-async
    --one-logger-project --one-logger-run-name --onnx-safe --optimizer-cpu-offload --optimizer-cuda-graph
    --optimizer-offload-fraction --otel-enabled --otel-service-name --otel-span-groups
    --outer-dp-sharding-strategy --output-bert-embeddings --output-logit-dtype
    --overlap-cpu-optimizer-d2h-h2d --overlap-dispatch-backward-with-experts-wgrad
    --overlap-moe-expert-parallel-comm --overlap-p2p-communication-warmup-flush
    --overlap-param-gather-with-optimizer-step --override-ckpt-iteration --patch-dim --perform-rl-step
    --phase-transition-iterations --pipeline-model-parallel-comm-backend --pipeline-model-parallel-layout
    --pretrained-checkpoint --q-lora-rank --qk-clip --qk-clip-alpha --qk-clip-threshold --qk-head-dim
    --qk-pos-emb-head-dim --query-in-block-prob --refit-method --relative-attention-max-distance
    --relative-attention-num-buckets --replication --replication-factor --replication-jump --rerun-mode
    --result-rejected-tracker-filename --retriever-report-topk-accuracies --retriever-score-scaling
    --reuse-grad-buf-for-mxfp8-param-ag --rl-consumption-granularity --rl-default-temperature
    --rl-default-top-k --rl-default-top-p --rl-durable-rollout-bank --rl-generation-lag
    --rl-importance-sampling-truncation-coef --rl-inference-expert-model-parallel-size
    --rl-inference-expert-tensor-model-parallel-size --rl-inference-logprobs-is-correction
    --rl-inference-model-unified-memory-level --rl-inference-parsers
    --rl-inference-pipeline-model-parallel-size --rl-inference-tensor-model-parallel-size
    --rl-kv-cache-management-mode --rl-max-inflight-requests --rl-offload-inference-model-weights-when-idle
    --rl-offload-optimizer-during-inference --rl-partial-rollouts --rl-persist-cuda-graphs --rl-profile
    --rl-profile-dir --rl-prompts-per-eval --rl-rollout-bank-dir --rl-rollout-bank-max-bytes
    --rl-sequence-packing-algo --rl-sequence-packing-max-sequences-per-bin --rl-skip-bos-token
    --rl-submission-granularity --rl-training-cuda-graphs --rl-use-sequence-packing
    --rl-verify-model-weights-swap --rotary-scaling-factor --run-workload-inspector-server --sample-rate
    --save-activations-interval --save-dgrads-interval --save-params-interval --save-retain-interval
    --save-tokens-per-expert-interval --save-wgrads-interval --sft --sft-tokenizer-prompt-format
    --sgd-momentum --sharp-enabled-group --short-seq-prob --spec --start-eval-at-iter
    --suggested-communication-unit-size --swin-backbone-type --symmetric-ar-type --te-precision-config-file
    --te-rng-tracker --tensor-parallel-num-weight-shards --test-mode --titles-data-path
    --torch-fsdp2-no-reshard-after-forward --tp-comm-bootstrap-backend --tp-comm-overlap-rs-dgrad
    --train-sync-interval --use-fused-weighted-squared-relu --use-grouped-gemm-for-dense-mlp
    --use-grouped-gemm-for-shared-expert --use-kitchen-attention --use-legacy-static-engine
    --use-mp-args-from-checkpoint-args --use-mup --use-one-sent-docs
    --use-ring-exchange-p2p --use-same-sampling-seed-across-dp-ranks --use-sharp --use-te-activation-func
    --use-torch-optimizer-for-cpu-offload --use-tp-pp-dp-mapping --use-transformer-engine-op-fuser
    --v-head-dim --validation-set-names --verify-integrity --vision-backbone-type --vision-pretraining
    --vision-pretraining-type --wgrad-deferral-limit --yaml-cfg --yarn-beta-fast --yarn-beta-slow
    --yarn-correction-range-round-to-int --yarn-original-max-position-embeddings
    """.split()  # noqa: SIM905 (530 names, four a line: a list literal would take one a line)
)
