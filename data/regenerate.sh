#!/usr/bin/env bash
# Regenerate the answers of the prepared prompts with the target, for both splits, against running servers.
#
#   data/regenerate.sh RECIPE ENDPOINT [ENDPOINT ...]
#   data/regenerate.sh qwen3-8b http://node1:8000 http://node2:8000
#
# Reads data/open-perfectblend/prompts/{train,validation}.jsonl (PROMPTS_DIR overrides) and writes the files
# the recipe trains on (its data.train / data.validation). Sampling comes from the recipe's `regenerate`
# section (temperature 0.7, top_p 0.8, top_k 20, up to 4096 new tokens, thinking off); the served model name
# is the recipe's target.path, so serve the model under that name (launch/slurm/regenerate.sbatch does).
# Resumable: rerun the same command to continue or to retry failed rows (exit status 1 while some failed).
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
RECIPE=$1
shift
ENDPOINT_ARGS=()
for endpoint in "$@"; do
    ENDPOINT_ARGS+=(--endpoint "$endpoint")
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PROMPTS_DIR=${PROMPTS_DIR:-data/open-perfectblend/prompts}
PYTHON=${PYTHON:-python}
status=0
for split in train validation; do
    output=$("$PYTHON" -c "import sys; from deepspec_train.kinds.recipe_validation import load_recipe; \
cfg = load_recipe(sys.argv[1], check_target=False); print(getattr(cfg.data, sys.argv[2])[0])" "$RECIPE" "$split")
    "$PYTHON" -m deepspec_train.commands.dispatch regenerate --backend http "${ENDPOINT_ARGS[@]}" --recipe "$RECIPE" \
        --input "$PROMPTS_DIR/$split.jsonl" --out "$output" || status=$?
done
exit $status
