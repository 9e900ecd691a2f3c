"""What each piece of vitlab's CPU inference path is worth, interleaved in one process against timm eager.

    python benchmarks/bench_cpu_inference.py vit_s16 32 8     # model, batch size, timed rounds

Variants of the same vitlab model (same weights): the default path (oneDNN fused linears and
batch chunks), oneDNN off (`vitlab.accel.onednn.disabled()`), chunks off
(`model.inference_chunk_bytes = None`), both off (the plain aten path, as timm runs), and timm.
Prints img/s, minor page faults per forward, and the ratio to timm (medians, and the median and
range of per-round ratios). Outputs are checked against the plain path first.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

import torch
from _common import onednn

from vitlab import create_model
from vitlab.bench import build_reference, time_calls


def main() -> None:
    name, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    torch.manual_seed(0)
    model = create_model(name).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)
    ref = build_reference("timm", model.config).eval()
    x = torch.randn(batch, 3, *model.config.img_size)
    default_chunk = model.inference_chunk_bytes

    def variant(use_onednn: bool, chunk: bool):
        def run() -> None:
            model.inference_chunk_bytes = default_chunk if chunk else None
            with contextlib.nullcontext() if use_onednn else onednn.disabled():
                model(x)

        return run

    runs = {
        "vitlab default": variant(True, True),
        "oneDNN off": variant(False, True),
        "chunks off": variant(True, False),
        "both off (aten)": variant(False, False),
        "timm": lambda: ref(x),
    }
    with torch.inference_mode():
        model.inference_chunk_bytes = None
        with onednn.disabled():
            want = model(x)
        model.inference_chunk_bytes = default_chunk
        print(f"max |default - aten path| logits: {(model(x) - want).abs().max().item():.2e}", flush=True)
        timed = time_calls(runs, rounds=rounds, warmup=1)  # one warm-up call each, then the rounds in turn
    keys = list(runs)
    times = {k: list(t.seconds) for k, t in timed.items()}
    faults = {k: list(t.faults) for k, t in timed.items()}
    base = times["timm"]
    print(f"{name}, batch {batch}, {rounds} rounds")
    print("| variant | img/s | page faults / forward | vs timm: medians | per-round median [range] |")
    print("|---|---|---|---|---|")
    for k in keys:
        pairs = sorted(b / t for b, t in zip(base, times[k]))
        print(
            f"| {k} | {batch / statistics.median(times[k]):.2f} | {statistics.median(faults[k]):.0f} | "
            f"{statistics.median(base) / statistics.median(times[k]):.3f}x | "
            f"{statistics.median(pairs):.3f}x [{pairs[0]:.3f}, {pairs[-1]:.3f}] |"
        )
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
