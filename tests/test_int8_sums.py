"""vitlab's int8 layer (``deploy/quantize.py``: ``Int8Linear``) sums its int8 products exactly on every x86 CPU.
oneDNN's int8 kernels for CPUs without VNNI (AVX2 only, AVX-512 before Cascade Lake, AMD before Zen 4) add each pair
of products in int16 with saturation, so ``torch._int_mm`` there gets full-range int8 sums wrong; there the layer
multiplies by the weight in halves, and a TorchScript trace asks the kernel at each call, since it may be served on
another CPU than the one that traced it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import warnings

import pytest
import torch

from vitlab.deploy import quantize
from vitlab.deploy.quantize import Int8Linear, int_mm_saturates


def saturating_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as oneDNN computes it without VNNI: ``a`` shifted to unsigned (+128), each pair of products along
    ``k`` summed in int16 with saturation (``vpmaddubsw``), the pairs summed in int32, the shift taken back."""
    u, w = a.long() + 128, b.long()
    if u.shape[1] % 2:
        u, w = torch.cat([u, torch.full_like(u[:, :1], 128)], 1), torch.cat([w, torch.zeros_like(w[:1])], 0)
    m, k = u.shape
    pairs = (u[:, :, None] * w[None]).reshape(m, k // 2, 2, -1).sum(2).clamp(-32768, 32767)
    return (pairs.sum(1) - 128 * w.sum(0)).int()


def no_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("_int_mm: no kernel here")  # the layer's own fallback: the same sums in float64


def _layer(seed: int = 0, d_in: int = 96, d_out: int = 48) -> Int8Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(d_in, d_out)
    torch.nn.init.uniform_(linear.weight, -1, 1)  # full-range int8 weights: the case that saturates
    return Int8Linear.from_float(linear)


def _out(layer: Int8Linear, x: torch.Tensor, kernel, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(torch, "_int_mm", kernel)
    int_mm_saturates.cache_clear()
    try:
        with torch.no_grad():
            return layer(x)
    finally:
        int_mm_saturates.cache_clear()


def test_the_emulated_kernel_is_the_one_measured():
    """The emulation gives the shortfall oneDNN gave under ``ONEDNN_MAX_CPU_ISA=AVX2`` for 127 x 127 over 64 terms
    (1,024,096 short of 1,032,256), and exact sums where every weight is within [-64, 64]."""
    q = torch.full((4, 64), 127, dtype=torch.int8)
    assert int(saturating_int_mm(q, q.t())[0, 0]) == 127 * 127 * 64 - 1_024_096
    w = torch.randint(-64, 65, (64, 9), dtype=torch.int8)
    r = torch.randint(-127, 128, (5, 64), dtype=torch.int8)
    assert torch.equal(saturating_int_mm(r, w), (r.long() @ w.long()).int())


def test_int8_sums_are_exact_where_the_kernel_saturates(monkeypatch):
    layer, x = _layer(), torch.randn(3, 7, 96)
    exact = _out(layer, x, no_kernel, monkeypatch)
    naive = torch.einsum("rk,ok->ro", x.reshape(-1, 96), layer.weight.float() * layer.weight_scale[:, None])
    assert (exact.reshape(-1, 48) - layer.bias - naive).abs().max() < 0.02 * naive.abs().max()  # int8's own error
    monkeypatch.setattr(torch, "_int_mm", saturating_int_mm)
    assert int_mm_saturates.__wrapped__()
    assert torch.equal(_out(layer, x, saturating_int_mm, monkeypatch), exact)
    layer.weight.mul_(-1)  # new weights in place (a state dict loaded into the layer)
    assert torch.equal(_out(layer, x, saturating_int_mm, monkeypatch), _out(layer, x, no_kernel, monkeypatch))


def test_a_kernel_that_sums_exactly_is_used_as_it_is(monkeypatch):
    calls = []

    def exact_int_mm(a, b):
        calls.append(tuple(a.shape))
        return (a.long() @ b.long()).int()

    layer, x = _layer(), torch.randn(2, 5, 96)
    assert torch.equal(_out(layer, x, exact_int_mm, monkeypatch), _out(layer, x, no_kernel, monkeypatch))
    assert calls[1:] == [(10, 96)]  # after the check, one product of the rows as they are: no halves


CHILD = """
import json, sys, warnings
import torch
from vitlab.deploy.quantize import Int8Linear, int_mm_saturates

state, x = torch.load(sys.argv[1]), torch.load(sys.argv[2])
layer = Int8Linear(state["weight"], state["weight_scale"], state["bias"])
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    traced = torch.jit.load(sys.argv[3])


def no_kernel(a, b):
    raise RuntimeError("no kernel")


with torch.no_grad():
    eager, served = layer(x), traced(x)
    torch._int_mm = no_kernel  # the layer's float64 sums
    exact = layer(x)
print(json.dumps({"saturates": int_mm_saturates(), "eager": torch.equal(eager, exact),
                  "trace": torch.equal(served, exact), "off": float((served - exact).abs().max())}))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="oneDNN's x86 kernels")
def test_an_int8_layer_and_its_trace_on_a_cpu_without_vnni(tmp_path):
    """The real kernel: a process whose oneDNN may use no more than AVX2 (the kernels of a CPU without VNNI). The
    trace is made here, on whatever CPU runs the tests, and served there."""
    layer, x = _layer(1), torch.randn(4, 9, 96)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(layer, (x,), check_trace=False)
    traced.save(str(tmp_path / "layer.pt"))
    torch.save(layer.state_dict(), tmp_path / "layer.pth")
    torch.save(x, tmp_path / "x.pth")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", CHILD, *(str(tmp_path / n) for n in ("layer.pth", "x.pth", "layer.pt"))]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["eager"] and seen["trace"], seen


def test_the_halves_add_up_to_the_weight_within_the_exact_range():
    w = torch.arange(-128, 127, dtype=torch.int8).reshape(5, 51)  # (-128: a torch.ao folder's weights may hold it)
    h = quantize._halves(w)
    hi, lo = h[:, :51], h[:, 51:]
    assert torch.equal(hi.long() + lo.long(), w.long()) and int(h.abs().max()) <= 64 and h.dtype == torch.int8
