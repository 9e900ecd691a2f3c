#!/usr/bin/env bash
# CIFAR-10 from scratch on 2 CPU cores in a fixed wall-clock budget (default 20 minutes), then
# fine-tuning at 48 px with the position embeddings resampled (default 5 minutes).
#
#   bash benchmarks/cifar10_small_data.sh                      # the full benchmark: ~26 minutes, the whole machine
#   BUDGET=1m FT_BUDGET=1m bash benchmarks/cifar10_small_data.sh   # a smoke test of the same commands
#
# The data is the ImageFolder copy in ../shared/data/cifar10 (JPEG q75, see its README). It is
# decoded once into the cache first, so the budget is spent on training, not on JPEG decoding.
# Model (MODEL=hybrid, the default): the paper's hybrid (Sec. 3.1) in its smallest form, the ResNet stem of
# R+Ti/16 (7x7 conv stride 2 + max-pool stride 2: 32 px -> an 8x8 feature map) with 1x1 patches, feeding a
# width-128, depth-6, 4-head, MLP-ratio-2 Transformer with fixed 2-D sine-cosine position embeddings and global
# average pooling (~0.81 M params). MODEL=vit: the same Transformer on 4x4 pixel patches (a plain ViT, 64
# tokens either way, the same cost per step). Recipe: small-data with the regularisers that only pay off over
# ~100 epochs (MixUp/CutMix, RandAugment, random erasing, stochastic depth) switched off, since 20 minutes on
# 2 cores is ~5 epochs; --compile (its compilation is paid inside the budget).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/cifar10}
OUT=${OUT:-runs/cifar10-$(date +%Y%m%d-%H%M%S)}
BUDGET=${BUDGET:-20m}
FT_BUDGET=${FT_BUDGET:-5m}
VITLAB=${VITLAB:-vitlab}
MODEL=${MODEL:-hybrid}
BATCH=${BATCH:-128}
COMPILE=${COMPILE---compile}
if [ "$MODEL" = hybrid ]; then ARCH=(--model vit_r_ti16 --patch-size 1); else ARCH=(--patch-size 4); fi

python -c "from vitlab.data import load_data; s = load_data('$DATA'); print('decoded:', s.describe())"

$VITLAB train --data "$DATA" --out "$OUT/scratch" --recipe small-data \
  "${ARCH[@]}" --dim 128 --depth 6 --heads 4 --mlp-ratio 2 --pool gap --posemb sincos2d \
  --batch-size "$BATCH" --lr 2e-3 --weight-decay 0.05 --warmup-epochs 0.3 --clip-grad 1 \
  --crop-scale 0.6,1 --hflip 0.5 --label-smoothing 0.1 \
  --mixup 0 --cutmix 0 --randaugment none --random-erasing 0 --drop-path 0 \
  --time-budget "$BUDGET" --no-progress $COMPILE

$VITLAB finetune --init "$OUT/scratch/model" --data "$DATA" --out "$OUT/ft48" --img-size 48 \
  --batch-size 128 --lr 0.03 --warmup-steps 20 --crop-scale 0.6,1 --label-smoothing 0.1 \
  --time-budget "$FT_BUDGET" --no-progress

python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for stage in ("scratch", "ft48"):
    s = json.load(open(f"{out}/{stage}/summary.json"))
    print(f"{stage:8s} test top-1 {100 * s['top1']:.2f}% (best {100 * s['best_top1']:.2f}%), {s['steps']} steps, "
          f"{s['epochs']} epochs, {s['images_per_sec']:.0f} img/s, {s['wall_s'] / 60:.1f} min, {s['params']:,} params")
PY
