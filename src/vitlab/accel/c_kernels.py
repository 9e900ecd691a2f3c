"""Fused element-wise kernels in C for the CPU training step, compiled on first use.

After the block's GEMMs and attention (:mod:`.fused_block`), a CPU training step still spends
a sixth of its time in memory-bound passes: LayerNorm, residual and bias adds, GELU, bias sums.
ATen runs each as its own pass over the activations and none of its kernels combine them.
``c_kernels.c`` does in one pass what takes ATen two or three:

- :func:`layer_norm` also writes ``x + bias`` for the residual the next GEMM accumulates onto;
- :func:`bias_gelu` reads the fc1 product without its bias, so neither the biased product is
  written back nor read again (the backward adds the bias on the fly);
- :func:`gelu_backward` also sums fc1's bias gradient;
- :func:`layer_norm_backward` also adds the residual gradient and sums the bias gradients of
  the layers that feed the residual stream (fc2 and the attention projection).

The library is compiled with the system's C compiler (``$CC``, else ``cc``) the first time a
model trains, into ``$VITLAB_CACHE/native`` (default ``~/.cache/vitlab/native``), keyed by the
source, the compiler, its flags and the CPU's model and instruction sets (``-march=native``: a
cache shared between different CPUs gets one file per kind of CPU). It needs glibc's libmvec
(Linux) and OpenMP; it uses the libgomp PyTorch has already loaded, so the kernels share
ATen's threads. Without a compiler, or with ``VITLAB_NATIVE=0``, :func:`kernels` returns
``None`` and the block runs ATen's kernels: same results to float32 rounding, a little slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .._fs import remove_stale
from .switch import Switch

__all__ = ["available", "bias_gelu", "disabled", "gelu_backward", "kernels", "layer_norm", "layer_norm_backward"]

_log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("c_kernels.c")
_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")
_LIBS = ("-lm",)

_switch = Switch()
disabled = _switch.disabled
"""Use ATen's kernels instead (benchmarks, debugging); process-wide."""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    return Path(os.environ.get("VITLAB_CACHE") or Path.home() / ".cache" / "vitlab") / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _key(cc: str, source: bytes) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256(source)
    for part in (cc, version, " ".join(_FLAGS), platform.machine(), _cpu_id()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _cpu_id() -> str:
    """The CPU's model name and feature flags: what ``-march=native`` compiles for. Both, since VMs
    of one model name can expose different instruction sets (AMX on some, not on others), and a
    library built for one would die of an illegal instruction on the other."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    model = next((ln for ln in lines if ln.startswith("model name")), "")
    flags = next((ln for ln in lines if ln.startswith(("flags", "Features"))), "")
    return f"{model}\n{flags}"


def _build() -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found ($CC or cc)")
    source = _SOURCE.read_bytes()
    folder = _cache_dir()
    target = folder / f"vitlab_native_{_key(cc, source)}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale(folder, "tmp-")
        tmp = folder / f"tmp-{os.getpid()}"
        with tempfile.TemporaryDirectory() as work:
            src = Path(work) / "c_kernels.c"
            src.write_bytes(source)
            done = subprocess.run(
                [cc, *_FLAGS, str(src), "-o", str(tmp), *_LIBS], capture_output=True, text=True, timeout=300
            )
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: concurrent first uses each write their own, one wins
    # torch is imported (this module imports it), so its libgomp is loaded and the library's
    # libgomp.so.1 resolves to it: one OpenMP thread pool for ATen and these kernels.
    lib = ctypes.CDLL(str(target))
    p, f, n = ctypes.c_void_p, ctypes.c_float, ctypes.c_longlong
    lib.vl_layer_norm.argtypes = [p, p, p, f, n, n, p, p, p, p, p]
    lib.vl_layer_norm.restype = None
    lib.vl_bias_gelu.argtypes = [p, p, n, n, p]
    lib.vl_bias_gelu.restype = None
    lib.vl_gelu_backward.argtypes = [p, p, p, n, n, p, p]
    lib.vl_gelu_backward.restype = ctypes.c_int
    lib.vl_layer_norm_backward.argtypes = [p, p, p, p, p, n, n, p, p, p, p, p, p]
    lib.vl_layer_norm_backward.restype = ctypes.c_int
    return lib


def kernels() -> ctypes.CDLL | None:
    """The compiled kernels, building them on the first call; ``None`` when they cannot be had
    (no compiler, a failed build, a non-Linux system, ``VITLAB_NATIVE=0``) or :func:`disabled`."""
    global _lib, _tried
    if not _switch.on:
        return None
    if not _tried:
        with _lock:
            if not _tried:
                if os.environ.get("VITLAB_NATIVE", "1") != "0" and platform.system() == "Linux":
                    try:
                        _lib = _build()
                    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                        _log.info("vitlab: native CPU kernels unavailable, using ATen's (%s)", err)
                _tried = True
    return _lib


def available() -> bool:
    """Whether the fused C kernels are in use (see :func:`kernels`)."""
    return kernels() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(*tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and not (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()):
            raise ValueError("native kernels take contiguous float32 CPU tensors")


def _lib_or_raise() -> ctypes.CDLL:
    lib = kernels()
    if lib is None:
        raise RuntimeError("native kernels are not available (see vitlab.accel.c_kernels.kernels)")
    return lib


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    residual_bias: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> None:
    """``out = LayerNorm(x) * weight + bias`` over the last dimension of the ``(m, d)`` matrix
    ``x``, its row means and reciprocal deviations into ``mean`` and ``rstd`` (``m`` each), and
    with ``residual_out``: ``residual_out = x + residual_bias`` in the same pass."""
    m, d = x.shape
    _check(x, weight, bias, out, mean, rstd, residual_bias, residual_out)
    if (residual_bias is None) != (residual_out is None):
        raise ValueError("residual_bias and residual_out go together")
    _lib_or_raise().vl_layer_norm(
        _ptr(x),
        _ptr(weight),
        _ptr(bias),
        eps,
        m,
        d,
        _ptr(out),
        _ptr(mean),
        _ptr(rstd),
        _ptr(residual_bias),
        _ptr(residual_out),
    )


def bias_gelu(h: torch.Tensor, bias: torch.Tensor, *, out: torch.Tensor) -> None:
    """``out = gelu(h + bias)`` (the exact, erf GELU) for an ``(m, n)`` matrix ``h``, left unchanged."""
    m, n = h.shape
    _check(h, bias, out)
    _lib_or_raise().vl_bias_gelu(_ptr(h), _ptr(bias), m, n, _ptr(out))


def gelu_backward(
    grad: torch.Tensor, h: torch.Tensor, bias: torch.Tensor, *, out: torch.Tensor, bias_grad: torch.Tensor
) -> None:
    """``out = grad * gelu'(h + bias)`` (``out`` may be ``grad``) and ``bias_grad`` its column sums."""
    m, n = h.shape
    _check(grad, h, bias, out, bias_grad)
    if _lib_or_raise().vl_gelu_backward(_ptr(grad), _ptr(h), _ptr(bias), m, n, _ptr(out), _ptr(bias_grad)):
        raise MemoryError("native gelu_backward: out of memory")


def layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor,
    weight_grad: torch.Tensor | None = None,
    bias_grad: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    residual_sum: torch.Tensor | None = None,
    out_sum: torch.Tensor | None = None,
) -> None:
    """The backward of :func:`layer_norm` from its input ``x`` and row statistics:
    ``out = residual + dLN/dx^T grad``, the affine gradients, and optionally the column sums of
    ``residual`` and of ``out`` (the bias gradients of the layers around the residual stream)."""
    m, d = x.shape
    _check(grad, x, mean, rstd, weight, out, weight_grad, bias_grad, residual, residual_sum, out_sum)
    if residual_sum is not None and residual is None:
        raise ValueError("residual_sum needs residual")
    failed = _lib_or_raise().vl_layer_norm_backward(
        _ptr(grad), _ptr(x), _ptr(mean), _ptr(rstd), _ptr(weight), m, d, _ptr(residual), _ptr(out),
        _ptr(weight_grad), _ptr(bias_grad), _ptr(residual_sum), _ptr(out_sum),
    )  # fmt: skip
    if failed:
        raise MemoryError("native layer_norm_backward: out of memory")
