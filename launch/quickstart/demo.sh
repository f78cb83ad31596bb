#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine, end to end on CPU:
#   set up .venv -> build the tiny world (once) -> train DSpark, DFlash and EAGLE-3 with the same budget ->
#   evaluate on held-out validation prompts and calibrate the confidence head (sequential temperature scaling) ->
#   export in the serving layouts -> evaluate the exports on the built-in code / prose / math suites with exact
#   speculative decoding -> print the comparison table and write the plots.
# Environment knobs: TINYWORLD=DIR (default artifacts/tinyworld), STEPS=N (drafter steps, default 600, the recipes'),
# PROMPTS=N (prompts per suite, default 8), NEW_TOKENS=N (per answer, default 64), RUNS=DIR (default runs/demo).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/quickstart/setup_env.sh
. .venv/bin/activate
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
TINYWORLD=${TINYWORLD:-artifacts/tinyworld}
STEPS=${STEPS:-600}
PROMPTS=${PROMPTS:-8}
NEW_TOKENS=${NEW_TOKENS:-64}
RUNS=${RUNS:-runs/demo}
start=$(date +%s)
stamp() { echo "[demo +$(( $(date +%s) - start ))s] $*"; }

if [ ! -f "$TINYWORLD/build_report.json" ]; then
    stamp "building the tiny world in $TINYWORLD"
    deepspec tinyworld build --out "$TINYWORLD" --preset small
fi
mkdir -p "$RUNS"
# Calibration prompts: the user turns of the validation conversations (held out from the eval suites).
python - "$TINYWORLD/conversations/validation.jsonl" "$RUNS/calibration_prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as dst:
    for line in src:
        row = json.loads(line)
        turns = [m["content"] for m in row["messages"] if m["role"] == "user"]
        dst.write(json.dumps({"id": row["id"], "category": row.get("category", "validation"), "turns": turns}) + "\n")
PY

declare -A LAYOUT=([tiny-dspark]=dspark [tiny-dflash]=dspark [tiny-eagle3]=eagle3)
for recipe in tiny-dspark tiny-dflash tiny-eagle3; do
    run="$RUNS/$recipe"
    stamp "training $recipe ($STEPS steps)"
    python train.py "recipe=$recipe" \
        "target.path=$TINYWORLD/target" \
        "data.train=[$TINYWORLD/conversations/train.jsonl]" \
        "data.validation=[$TINYWORLD/conversations/validation.jsonl]" \
        "run.output_dir=$run" run.overwrite=true "train.max_steps=$STEPS" "train.eval_every=$STEPS" "train.checkpoint_every=$STEPS"
    calibration=()
    if [ "$recipe" = tiny-dspark ]; then
        stamp "calibrating $recipe on validation prompts"
        deepspec eval --target "$TINYWORLD/target" --drafter "$run/drafter" --suite "$RUNS/calibration_prompts.jsonl" \
            --max-prompts 48 --max-new-tokens "$NEW_TOKENS" --out "$run/calibration/eval.json" \
            --save-traces "$run/calibration/traces.jsonl" --no-progress
        deepspec calibrate --traces "$run/calibration/traces.jsonl" --out "$run/calibration"
        calibration=(--calibration "$run/calibration/calibration.json")
    fi
    stamp "exporting $recipe (${LAYOUT[$recipe]} layout)"
    deepspec export --drafter "$run/drafter" --target "$TINYWORLD/target" --out "$run/export" \
        --layout "${LAYOUT[$recipe]}" --dtype fp32 "${calibration[@]}"
    stamp "evaluating the $recipe export on the tiny-world suites"
    deepspec eval --target "$TINYWORLD/target" --drafter "$run/export" --tinyworld "$TINYWORLD" \
        --suite tinyworld:code --suite tinyworld:prose --suite tinyworld:math \
        --max-prompts "$PROMPTS" --max-new-tokens "$NEW_TOKENS" \
        --out "$run/eval/results.json" --save-traces "$run/eval/traces.jsonl" --no-progress
done

stamp "comparing"
deepspec compare "$RUNS/tiny-dspark" "$RUNS/tiny-dflash" "$RUNS/tiny-eagle3" --out "$RUNS/compare"
stamp "done: table in $RUNS/compare/comparison.md, plots in $RUNS/compare/*.png, exports in $RUNS/tiny-*/export"
