"""onnxruntime vs PyTorch eager on the same exported model, interleaved in one process.

python benchmarks/bench_export.py --model vit_s16 --batch-size 32 --steps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from vitlab import create_model
from vitlab.export import export_model, load_exported, run_exported


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_s16")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    torch.manual_seed(0)
    m = create_model(args.model).eval()
    torch.nn.init.normal_(m.head.weight, std=0.02)
    with tempfile.TemporaryDirectory() as d:
        res = export_model(m, d, format="onnx")
        print(f"export {res.seconds:.1f} s, max |onnxruntime - PyTorch| on a batch of 3: {res.max_abs_diff:.2e}")
        sess = load_exported(res.path)
        x = torch.randn(args.batch_size, 3, *m.config.img_size)
        xn = x.numpy()
        with torch.inference_mode():
            diff = float(np.abs(run_exported(sess, xn) - m(x).numpy()).max())
            print(f"max |diff| at batch {args.batch_size}: {diff:.2e}")
            ts: dict[str, list[float]] = {"pytorch": [], "onnxruntime": []}
            for i in range(args.steps + 1):
                for k in ("pytorch", "onnxruntime") if i % 2 else ("onnxruntime", "pytorch"):
                    t0 = time.perf_counter()
                    m(x) if k == "pytorch" else run_exported(sess, xn)
                    if i:
                        ts[k].append(time.perf_counter() - t0)
    rates = {k: args.batch_size / statistics.median(v) for k, v in ts.items()}
    for k, v in rates.items():
        print(f"{k:>12}: {v:.2f} img/s")
    print(f"onnxruntime / pytorch: {rates['onnxruntime'] / rates['pytorch']:.3f}x")
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
