#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install deepspec_train with its test extras.
# torch is pinned first to the CPU build this machine carries; the project's looser range then installs nothing
# more (a bare "torch" requirement would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}"
python -m pip install --quiet -e ".[dev]"
