#!/usr/bin/env bash
# Masked patch prediction (paper Sec. 4.6) at small scale on CIFAR-10: from scratch for TOTAL
# minutes vs MPP pre-training for MPP_BUDGET then fine-tuning for FT_BUDGET (MPP_BUDGET + FT_BUDGET = TOTAL).
#
#   bash benchmarks/mpp_cifar10.sh                                     # 5 min vs 3 + 2 min, ~10 min of machine time
#   PARALLEL=1 bash benchmarks/mpp_cifar10.sh                          # both arms at once, one core each: ~5 min
#   SCRATCH_BUDGET=1m MPP_BUDGET=40s FT_BUDGET=20s bash benchmarks/mpp_cifar10.sh   # a smoke test
#
# Same model (patch 4, width DIM=64, depth DEPTH=4, 4 heads, MLP ratio 2, mean-pooled tokens: ~0.14 M params),
# same seed, and the same classification recipe for the scratch run and the fine-tuning (small-data
# with the long-run regularisers off, as in cifar10_small_data.sh), so the initialisation is the only
# difference. MPP uses the labels nowhere (the `mpp` recipe: Adam lr 1e-3, warmup + cosine).
# Budgets are wall-clock (`--time-budget`), so the numbers depend on the machine's load: the
# script prints `uptime` before and after. This is a small-scale sanity check, not the paper's
# setting (JFT, ViT-B/16, 1M steps), where MPP gave +2% over scratch and -4% vs supervised pre-training.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/cifar10}
OUT=${OUT:-runs/mpp-cifar10-$(date +%Y%m%d-%H%M%S)}
SCRATCH_BUDGET=${SCRATCH_BUDGET:-5m}
MPP_BUDGET=${MPP_BUDGET:-3m}
FT_BUDGET=${FT_BUDGET:-2m}
THREADS=${THREADS:-1}
PARALLEL=${PARALLEL:-0}
VITLAB=${VITLAB:-vitlab}

DIM=${DIM:-64}
DEPTH=${DEPTH:-4}
ARCH=(--patch-size 4 --dim "$DIM" --depth "$DEPTH" --heads 4 --mlp-ratio 2 --pool gap)
CLASSIFY=(--recipe small-data --batch-size 128 --lr 2e-3 --weight-decay 0.05 --warmup-steps 30 --clip-grad 1
  --crop-scale 0.6,1 --hflip 0.5 --label-smoothing 0.1 --mixup 0 --cutmix 0 --randaugment none --random-erasing 0 --drop-path 0)
RUN=(--seed 0 --threads "$THREADS" --keep last --no-progress)

mkdir -p "$OUT"
python -c "from vitlab.data import load_data; s = load_data('$DATA'); print('decoded:', s.describe())"
echo "before: $(uptime)"

scratch() {
  $VITLAB train --data "$DATA" --out "$OUT/scratch" "${ARCH[@]}" "${CLASSIFY[@]}" --time-budget "$SCRATCH_BUDGET" "${RUN[@]}"
}
pretrain_then_finetune() {
  $VITLAB train --objective mpp --data "$DATA" --out "$OUT/mpp" "${ARCH[@]}" \
    --batch-size 128 --lr 1e-3 --warmup-steps 30 --crop-scale 0.6,1 --time-budget "$MPP_BUDGET" "${RUN[@]}"
  $VITLAB finetune --init "$OUT/mpp/model" --data "$DATA" --out "$OUT/mpp_ft" "${CLASSIFY[@]}" --time-budget "$FT_BUDGET" "${RUN[@]}"
}

if [ "$PARALLEL" = 1 ]; then
  scratch > "$OUT/scratch.log" 2>&1 &
  pid=$!
  pretrain_then_finetune
  wait "$pid"
  cat "$OUT/scratch.log"
else
  scratch
  pretrain_then_finetune
fi
echo "after: $(uptime)"

python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = []
for stage, what in (("scratch", "from scratch"), ("mpp", "MPP pre-training (colour top-1)"), ("mpp_ft", "MPP, then fine-tuned")):
    s = json.load(open(f"{out}/{stage}/summary.json"))
    rows.append(f"| {what} | {s['steps']} | {s['epochs']} | {s['wall_s'] / 60:.1f} | {100 * s['top1']:.2f}% |")
table = "| run | steps | epochs | wall (min) | test top-1 |\n|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
open(f"{out}/results.md", "w").write(table)
print(table)
PY
