#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine: set up .venv, build the tiny world (once), then
# train DSpark, DFlash and EAGLE-3 drafters on it with the same budget and print their validation metrics.
# Environment: TINYWORLD=DIR (default artifacts/tinyworld), STEPS=N (default: each recipe's max_steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/quickstart/setup_env.sh
. .venv/bin/activate
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
TINYWORLD=${TINYWORLD:-artifacts/tinyworld}
start=$(date +%s)

if [ ! -f "$TINYWORLD/build_report.json" ]; then
    deepspec tinyworld build --out "$TINYWORLD" --preset small
fi

steps=()
[ -n "${STEPS:-}" ] && steps=("train.max_steps=$STEPS")
for recipe in tiny-dspark tiny-dflash tiny-eagle3; do
    python train.py "recipe=$recipe" \
        "target.path=$TINYWORLD/target" \
        "data.train=[$TINYWORLD/conversations/train.jsonl]" \
        "data.validation=[$TINYWORLD/conversations/validation.jsonl]" \
        "run.output_dir=runs/$recipe" "${steps[@]}"
done

python - <<'PY'
import json
print(f"\n{'drafter':<12} {'val E[L]':>9} {'tau(analytic)':>14} {'conf ECE':>9}  c*_k")
for recipe in ("tiny-dspark", "tiny-dflash", "tiny-eagle3"):
    records = [json.loads(line) for line in open(f"runs/{recipe}/metrics.jsonl")]
    val = [r for r in records if "val/expected_len" in r][-1]
    curve = " ".join(f"{val[k]:.2f}" for k in sorted(v for v in val if v.startswith("val/accept_")) if k[11:].isdigit())
    ece = val.get("val/conf_ece")
    print(f"{recipe:<12} {val['val/expected_len']:>9.3f} {val['val/tau_analytic']:>14.3f} "
          f"{'-' if ece is None else f'{ece:.3f}':>9}  {curve}")
PY
echo "demo finished in $(( $(date +%s) - start )) s; runs in runs/tiny-*/ (metrics.jsonl, drafter/, W&B offline runs)"
