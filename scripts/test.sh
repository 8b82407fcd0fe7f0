#!/usr/bin/env bash
# The test command: makes (or reuses) a virtual environment, installs gptrain with its
# test extras, and runs the whole suite on two workers. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GPTRAIN_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# torch first, only where the venv has none (an installed torch is kept as it is): torch==2.13.0 is
# the local CPU wheel on the CI machines, but the CUDA build from PyPI on Linux. For the CPU build
# elsewhere, install it into the venv first:
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q -e '.[test]'
# Two workers, each taking whole test files (a file's shared launches are built once); GPTRAIN_TEST_WORKERS=0
# runs in this process, as does `-n 0` among the arguments.
exec "$VENV/bin/python" -m pytest -n "${GPTRAIN_TEST_WORKERS:-2}" --dist loadfile "$@"
