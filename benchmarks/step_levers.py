"""Step time of the speedrun's two models with and without the per-step levers of issue 23: token dropping
(``--token-drop``) and bf16 autocast (``--precision bf16``), on random data so that only the model's training step
(forward, backward, fused AdamW) is timed. The speedrun itself (``speedrun.py``) measures what they buy in accuracy.

    python benchmarks/step_levers.py                       # both tracks, drop 0 / 0.5, fp32 / bf16, batch 128
    python benchmarks/step_levers.py --tracks vit --drops 0,0.25,0.5 --precisions fp32 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from vitlab.accel import accelerate
from vitlab.models import VisionTransformer
from vitlab.models.config import ViTConfig
from vitlab.models.registry import model_config


def build(track: str, *, token_drop: float) -> VisionTransformer:
    """The speedrun's model (width 128, depth 6, 4 heads, MLP 256, GAP, sin-cos 2-D) for ``track``."""
    kw = dict(embed_dim=128, depth=6, num_heads=4, mlp_dim=256, img_size=32, num_classes=10, pool="gap")
    kw.update(posemb="sincos2d", patch_drop_rate=token_drop)
    if track == "vit":
        return accelerate(VisionTransformer(ViTConfig(name="vit_custom", patch_size=4, **kw)))
    return accelerate(VisionTransformer(model_config("vit_r_ti16").replace(patch_size=1, **kw)))


def step_ms(track: str, *, token_drop: float, bf16: bool, batch: int, steps: int, warmup: int = 3) -> float:
    """Median milliseconds of one training step over ``steps`` (after ``warmup`` untimed ones)."""
    torch.manual_seed(0)
    model = build(track, token_drop=token_drop).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tracks", default="vit,hybrid")
    p.add_argument("--drops", default="0,0.5", help="token-drop rates")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"| track | token drop | precision | ms per step of {a.batch} | img/s |\n|---|---:|---|---:|---:|")
    for track in a.tracks.split(","):
        for drop in map(float, a.drops.split(",")):
            for prec in a.precisions.split(","):
                ms = step_ms(track, token_drop=drop, bf16=prec == "bf16", batch=a.batch, steps=a.steps)
                print(f"| {track} | {drop:g} | {prec} | {ms:.0f} | {1000 * a.batch / ms:.0f} |", flush=True)


if __name__ == "__main__":
    main()
