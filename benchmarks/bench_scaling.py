"""Inference cost of the /16 models at 224, 384 and 512 px (sequence length 197, 577, 1025),
with the share of time spent in attention (item 6 of the performance issue).

The attention share is measured with torch.profiler: the time inside
``scaled_dot_product_attention`` (the softmax(QK^T)V core, Eq. 2's MSA minus its
qkv and output projections) over the whole forward. The analytic FLOP share
``2 T^2 D / (4 T D^2 + 2 T^2 D + 2 T D D_mlp)`` of each block is printed beside it.

    python benchmarks/bench_scaling.py --models vit_s16 vit_b16 --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

from vitlab import create_model
from vitlab.bench import time_calls
from vitlab.models import count_macs


def attention_share(model: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    attn = sum(e.cpu_time_total for e in events if e.key == "aten::scaled_dot_product_attention")
    return attn / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["vit_s16", "vit_b16"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[224, 384, 512])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    for name in args.models:
        for size in args.sizes:
            torch.manual_seed(0)
            m = create_model(name, img_size=size).eval()
            cfg = m.config
            x = torch.randn(args.batch_size, 3, size, size)
            with torch.inference_mode():
                timed = time_calls({name: lambda m=m, x=x: m(x)}, rounds=args.steps, warmup=1)[name]
            t = cfg.num_patches + 1
            d, h = cfg.embed_dim, cfg.mlp_dim
            flop_share = 2 * t * t * d / (4 * t * d * d + 2 * t * t * d + 2 * t * d * h)
            med = timed.median
            row = {
                "model": name,
                "img_size": size,
                "tokens": t,
                "gflops_per_image": round(2 * count_macs(cfg) / 1e9, 2),
                "ms_per_image": round(1e3 * med / args.batch_size, 1),
                "images_per_sec": round(args.batch_size / med, 2),
                "attention_time_share": round(attention_share(m, x), 3),
                "attention_flop_share": round(flop_share, 3),
            }
            print(json.dumps(row), flush=True)
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
