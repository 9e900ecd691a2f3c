"""vitlab eager, vitlab torch.compile + frozen weights, timm eager, timm compiled + frozen: inference,
interleaved in one process, with compile times and per-pair ratios against timm eager.

    python benchmarks/bench_compile.py vit_s16 32 6      # model, batch size, timed rounds
"""

from __future__ import annotations

import copy
import os
import statistics
import sys

import torch
import torch._inductor.config as ic
from _common import Stopwatch

from vitlab import create_model
from vitlab.bench import build_reference, time_calls


def main() -> None:
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
            clock = Stopwatch()
            with ic.patch(freezing=True):
                out = c(x)
            print(f"{k} compile+freeze: {clock.elapsed():.1f} s", flush=True)
            if k == "vitlab":
                print("max |compiled - eager| logits:", (out - want).abs().max().item(), flush=True)
            fs[f"{k} compiled"] = c
        timed = time_calls({k: lambda f=f: f(x) for k, f in fs.items()}, rounds=steps)
        res = {k: list(t.seconds) for k, t in timed.items()}
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


if __name__ == "__main__":
    main()
