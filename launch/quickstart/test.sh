#!/usr/bin/env bash
# Set up the environment and run the test suite: the default run (unit, multi-process gloo, tiny-world integration,
# scale-model and long-context tiers at minimal cost) and the Slurm tier, which runs only when `-m slurm` asks for
# it because it installs Slurm with apt-get when run as root. The Slurm tier mostly waits on apt and on Slurm's
# scheduler, so it runs beside the default run (its output follows the default run's); the script fails if either
# does. `--full` as the first argument also runs the full tier after them (`-m full`: the cross product of production
# dimensions, docs/contributors/testing.md says when a change calls for it). Other arguments go to the default run.
set -euo pipefail
cd "$(dirname "$0")/../.."
full=0
if [ "${1:-}" = "--full" ]; then
    full=1
    shift
fi
bash launch/quickstart/setup_env.sh
. .venv/bin/activate
export WANDB_MODE=offline WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
# One intra-op thread per process: two pytest workers already keep the 2 cores busy, and a second OpenMP thread in
# each only spins and hands off against the other worker (the launched ranks get one thread already).
export OMP_NUM_THREADS=1
slurm_log=$(mktemp)
python -m pytest -q -p no:cacheprovider -m slurm > "$slurm_log" 2>&1 &
slurm_pid=$!
# Two pytest workers, whole files each (module fixtures such as a tier's shared launch stay in one worker): most
# tests wait on subprocesses, gloo and process start-up, so two share the 2 cores well.
status=0
python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 "$@" || status=$?
slurm_status=0
wait "$slurm_pid" || slurm_status=$?
echo "--- Slurm tier (python -m pytest -m slurm) ---"
cat "$slurm_log"
rm -f "$slurm_log"
full_status=0
if [ "$full" -eq 1 ]; then
    echo "--- full tier (python -m pytest -m full) ---"
    python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 -m full || full_status=$?
fi
if [ "$status" -ne 0 ]; then exit "$status"; fi
if [ "$slurm_status" -ne 0 ]; then exit "$slurm_status"; fi
exit "$full_status"
