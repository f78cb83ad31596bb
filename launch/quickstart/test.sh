#!/usr/bin/env bash
# Set up the environment and run the whole test suite (unit, multi-process gloo, tiny-world integration).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/quickstart/setup_env.sh
. .venv/bin/activate
export WANDB_MODE=offline WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
