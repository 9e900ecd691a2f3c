"""Quick equal-budget CIFAR-10 experiments, used to choose the model and recipe of
``cifar10_small_data.sh`` (results in docs/cifar10.md).

A deliberately small harness (not ``vitlab train``): the whole training set as one uint8 tensor,
batched pad-4 crop + flip, AdamW with warmup + cosine on either a wall-clock budget or a fixed
number of steps (``steps=N``: comparable when the machine's load changes), one evaluation on the
10,000 test images at the end. Each run appends one JSON line to ``--log``.

    python benchmarks/cifar10_sweep.py base 300                                   # 5 minutes, the plain ViT
    python benchmarks/cifar10_sweep.py sincos 300 posemb=sincos2d
    python benchmarks/cifar10_sweep.py hybrid 0 posemb=sincos2d model=vit_r_ti16 patch=1 steps=600
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from _common import Stopwatch, param_groups

from vitlab.data import load_data
from vitlab.models import create_model

DEFAULTS = dict(
    dim=128, depth=6, heads=4, mlp=2.0, patch=4, bs=128, lr=2e-3, wd=0.05, warm=0.03, ls=0.1, posemb="learn",
    pool="gap", compile=0, model="vit_ti16", seed=0, steps=0, data="../shared/data/cifar10", log="cifar10_sweep.jsonl",
)  # fmt: skip


def pad_crop_flip(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Per-image random ``pad``-pixel-padded crop and horizontal flip of a uint8 batch, in two gathers."""
    b, c, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    i, j = torch.randint(0, 2 * pad + 1, (b,)), torch.randint(0, 2 * pad + 1, (b,))
    rows = (i[:, None] + torch.arange(h))[:, None, :, None].expand(b, c, h, w + 2 * pad)
    cols = (j[:, None] + torch.arange(w))[:, None, None, :].expand(b, c, h, w)
    x = xp.gather(2, rows).gather(3, cols)
    return torch.where((torch.rand(b) < 0.5)[:, None, None, None], x.flip(3), x)


def main(argv: list[str]) -> dict:
    name, budget = argv[0], float(argv[1])
    a = dict(DEFAULTS)
    for kv in argv[2:]:
        k, v = kv.split("=", 1)
        a[k] = v if isinstance(a[k], str) else type(a[k])(v)
    torch.manual_seed(a["seed"])
    s = load_data(a["data"], progress=False)
    xtr = torch.from_numpy(np.array(s.train.images)).permute(0, 3, 1, 2).contiguous()
    ytr = torch.from_numpy(np.asarray(s.train.labels)).long()
    xte = torch.from_numpy(np.array(s.val.images)).permute(0, 3, 1, 2).contiguous()
    yte = torch.from_numpy(np.asarray(s.val.labels)).long()
    m = create_model(
        a["model"], img_size=32, patch_size=a["patch"], embed_dim=a["dim"], depth=a["depth"], num_heads=a["heads"],
        mlp_dim=int(a["dim"] * a["mlp"]), num_classes=10, pool=a["pool"], class_token=a["pool"] == "cls",
        posemb=a["posemb"],
    )  # fmt: skip
    opt = torch.optim.AdamW(param_groups(m, a["wd"]), lr=a["lr"], fused=True)
    run = torch.compile(m) if a["compile"] else m

    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x.float() / 255 - 0.5) / 0.5

    clock, step, seen, losses = Stopwatch(), 0, 0, []
    done = False
    while not done:
        perm = torch.randperm(len(xtr))
        for k in range(0, len(perm) - a["bs"] + 1, a["bs"]):
            frac = step / a["steps"] if a["steps"] else clock.elapsed() / budget
            if frac >= 1:
                done = True
                break
            warm = a["warm"]
            lr = a["lr"] * (frac / warm if frac < warm else 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm))))
            for g in opt.param_groups:
                g["lr"] = lr
            idx = perm[k : k + a["bs"]]
            loss = F.cross_entropy(run(norm(pad_crop_flip(xtr[idx]))), ytr[idx], label_smoothing=a["ls"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step, seen = step + 1, seen + len(idx)
            losses.append(loss.item())
            if step % 200 == 0:
                print(
                    f"  {name} step {step} {clock.elapsed():.0f}s loss {np.mean(losses[-200:]):.3f}",
                    flush=True,
                )
    wall = clock.elapsed()
    m.eval()
    with torch.inference_mode():
        correct = sum(
            int((m(norm(xte[k : k + 500])).argmax(1) == yte[k : k + 500]).sum()) for k in range(0, len(xte), 500)
        )
    r = dict(name=name, top1=correct / len(xte), done_steps=step, epochs=seen / len(xtr), img_s=seen / wall,
             wall_s=wall, train_loss=float(np.mean(losses[-100:])), params=sum(p.numel() for p in m.parameters()),
             **a)  # fmt: skip
    print(json.dumps(r), flush=True)
    with open(a["log"], "a") as f:
        f.write(json.dumps(r) + "\n")
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
