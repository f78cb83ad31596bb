#!/usr/bin/env bash
# The prepared GPU check of issue 36 (bench/gpu_check.py says what it measures): one JSON and a summary.
#   bash bench/gpu_check.sh [OUT_DIR] [--device cpu]    # default OUT_DIR: gpu_check_out
#   bash bench/gpu_check.sh OUT_DIR realworld [ARGS]    # the SmolLM2 comparison instead (bench/gpu_realworld.py)
# Each is bounded to 8 minutes (one H100); a phase that fails is recorded in the JSON. The comparison's own guard
# skips a phase that no longer fits its 480 s; the timeout here leaves it a minute to write its JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
shift || true
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = realworld ]; then
  shift
  timeout 540 python bench/gpu_realworld.py --out "$out" "$@"
  echo "written: $out/gpu_realworld.json $out/validation_expected_len.png"
  exit 0
fi
timeout 480 python bench/gpu_check.py --out "$out" "$@"
echo "written: $out/gpu_check.json $out/gpu_check.txt"
