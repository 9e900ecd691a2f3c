"""vitlab eager, vitlab torch.compile + frozen weights, timm eager, timm compiled + frozen: inference,
interleaved in one process, with compile times and per-pair ratios against timm eager.

    python benchmarks/bench_compile.py vit_s16 32 6      # model, batch size, timed rounds
"""

import copy
import os
import statistics
import sys
import time

import torch
import torch._inductor.config as ic

from vitlab import create_model
from vitlab.bench import build_reference

name, B, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("load", os.getloadavg(), flush=True)
torch.manual_seed(0)
m = create_model(name).eval()
torch.nn.init.normal_(m.head.weight, std=0.02)
r = build_reference("timm", m.config).eval()
x = torch.randn(B, 3, 224, 224)
fs = {}
with torch.inference_mode():
    want = m(x)
    for k, mod in (("vitlab", m), ("timm", r)):
        fs[f"{k} eager"] = mod
        c = torch.compile(copy.deepcopy(mod))
        t = time.perf_counter()
        with ic.patch(freezing=True):
            out = c(x)
        print(f"{k} compile+freeze: {time.perf_counter() - t:.1f} s", flush=True)
        if k == "vitlab":
            print("max |compiled - eager| logits:", (out - want).abs().max().item(), flush=True)
        fs[f"{k} compiled"] = c
    res = {k: [] for k in fs}
    keys = list(fs)
    for i in range(steps):
        for k in keys if i % 2 == 0 else keys[::-1]:
            t = time.perf_counter()
            fs[k](x)
            res[k].append(time.perf_counter() - t)
    for k, v in res.items():
        print(f"{k:>16}: {B / statistics.median(v):6.2f} img/s")
    te = res["timm eager"]
    for k in ("vitlab eager", "vitlab compiled", "timm compiled"):
        pr = sorted(a / b for a, b in zip(te, res[k]))
        print(
            f"{k} / timm eager: ratio of medians {statistics.median(te) / statistics.median(res[k]):.3f}, "
            f"per-pair median {statistics.median(pr):.3f} [{pr[0]:.3f}, {pr[-1]:.3f}]"
        )
print("load", os.getloadavg(), flush=True)
