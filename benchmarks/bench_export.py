"""onnxruntime vs PyTorch eager on the same exported model, interleaved in one process.

python benchmarks/bench_export.py --model vit_s16 --batch-size 32 --steps 5
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from _common import export_model, load_exported, run_exported

from vitlab import create_model
from vitlab.bench import time_calls


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
            calls = {"onnxruntime": lambda: run_exported(sess, xn), "pytorch": lambda: m(x)}
            ts = time_calls(calls, rounds=args.steps, warmup=1)  # in turn, onnxruntime first in the warm-up round
    rates = {k: args.batch_size / ts[k].median for k in ("pytorch", "onnxruntime")}
    for k, v in rates.items():
        print(f"{k:>12}: {v:.2f} img/s")
    print(f"onnxruntime / pytorch: {rates['onnxruntime'] / rates['pytorch']:.3f}x")
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
