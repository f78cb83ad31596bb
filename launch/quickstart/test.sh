#!/usr/bin/env bash
# Set up the environment and run the whole test suite: the default run (unit, multi-process gloo, tiny-world
# integration, scale-model tier), then the Slurm tier, which runs only when `-m slurm` asks for it because it
# installs Slurm with apt-get when run as root. Extra arguments go to the default run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/quickstart/setup_env.sh
. .venv/bin/activate
export WANDB_MODE=offline WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
# Two pytest workers, whole files each (module fixtures such as a tier's shared launch stay in one worker): most
# tests wait on subprocesses, gloo and process start-up, so two share the 2 cores well.
python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 "$@"
python -m pytest -q -p no:cacheprovider -m slurm
