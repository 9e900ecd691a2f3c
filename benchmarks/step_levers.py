"""Step time of the speedrun's two models with and without the per-step levers of issue 23: token dropping
(``--token-drop``) and bf16 autocast (``--precision bf16``), on random data so that only the model's training step
(forward, backward, vitlab's AdamW) is timed, by ``vitlab.bench.benchmark``. The speedrun itself
(``speedrun.py``) measures what they buy in accuracy.

    python benchmarks/step_levers.py                       # both tracks, drop 0 / 0.5, fp32 / bf16, batch 128
    python benchmarks/step_levers.py --tracks vit --drops 0,0.25,0.5 --precisions fp32 --steps 20
"""

from __future__ import annotations

import argparse

from vitlab.bench import benchmark

MODEL = dict(img_size=32, embed_dim=128, depth=6, num_heads=4, mlp_dim=256, pool="gap", posemb="sincos2d")
"""The speedrun's Transformer (``speedrun.py``'s width 128, depth 6, 4 heads, MLP ratio 2, GAP, sin-cos 2-D)."""
TRACKS = {"vit": ("vit_s16", {"patch_size": 4}), "hybrid": ("vit_r_ti16", {"patch_size": 1})}
"""``track -> (registered model, overrides)``: 4x4 patches, or the R+Ti/16 stem with 1x1 patches."""


def step_ms(track: str, *, token_drop: float, bf16: bool, batch: int, steps: int, threads: int | None) -> float:
    """Median milliseconds of one training step (forward, backward, vitlab's AdamW) over ``steps``:
    :func:`vitlab.bench.benchmark` in ``train`` mode."""
    name, arch = TRACKS[track]
    r = benchmark(
        name,
        mode="train",
        batch_size=batch,
        num_classes=10,
        dtype="bfloat16" if bf16 else "float32",
        steps=steps,
        warmup=3,
        threads=threads,
        measure_peak=False,
        patch_drop_rate=token_drop,
        **MODEL,
        **arch,
    )
    return r.step_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tracks", default="vit,hybrid")
    p.add_argument("--drops", default="0,0.5", help="token-drop rates")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args()
    print(f"| track | token drop | precision | ms per step of {a.batch} | img/s |\n|---|---:|---|---:|---:|")
    for track in a.tracks.split(","):
        for drop in map(float, a.drops.split(",")):
            for prec in a.precisions.split(","):
                ms = step_ms(
                    track, token_drop=drop, bf16=prec == "bf16", batch=a.batch, steps=a.steps, threads=a.threads
                )
                print(f"| {track} | {drop:g} | {prec} | {ms:.0f} | {1000 * a.batch / ms:.0f} |", flush=True)


if __name__ == "__main__":
    main()
