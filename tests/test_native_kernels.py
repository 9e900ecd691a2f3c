"""The fused C kernels of the CPU training step (accel/c_kernels.py) against ATen's, and the
returned-tensor reuse of the block's workspace (``Workspace.returned``)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from vitlab.accel import FastBlock as Block
from vitlab.accel import c_kernels as native
from vitlab.accel.buffers import Workspace

needs_kernels = pytest.mark.skipif(not native.available(), reason="no C compiler: the ATen kernels run instead")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """Both thread counts: the column sums add per-thread partial sums."""
    prev = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(prev)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_kernels_build_where_a_compiler_is():
    """CI has a C compiler, so the fast path must be the one it tests."""
    if shutil.which("cc") is None:
        pytest.skip("no cc")
    assert native.available()


@needs_kernels
@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 70), d=st.sampled_from([1, 5, 16, 33, 192]), eps=st.sampled_from([1e-6, 1e-5]))
def test_layer_norm_matches_aten(m, d, eps):
    x = randn(m, d, seed=0) * 3 + 1
    w, b, rb = randn(d, seed=1), randn(d, seed=2), randn(d, seed=3)
    out, mean, rstd, res = torch.empty(m, d), torch.empty(m, 1), torch.empty(m, 1), torch.empty(m, d)
    native.layer_norm(x, w, b, eps, out=out, mean=mean, rstd=rstd, residual_bias=rb, residual_out=res)
    want, want_mean, want_rstd = torch.ops.aten.native_layer_norm(x, [d], w, b, eps)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd, want_rstd, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res, x + rb, rtol=0, atol=0)


@needs_kernels
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_backward_matches_autograd(threads, residual):
    m, d = 301, 48
    x = (randn(m, d, seed=0) * 2).requires_grad_(True)
    w, b = randn(d, seed=1).requires_grad_(True), randn(d, seed=2).requires_grad_(True)
    g, r = randn(m, d, seed=3), randn(m, d, seed=4)
    F.layer_norm(x, (d,), w, b, 1e-6).backward(g)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x.detach(), [d], w.detach(), b.detach(), 1e-6)
    dx, dw, db, rsum, dxsum = torch.empty(m, d), torch.empty(d), torch.empty(d), torch.empty(d), torch.empty(d)
    native.layer_norm_backward(
        g, x.detach(), mean, rstd, w.detach(), out=dx, weight_grad=dw, bias_grad=db,
        residual=r if residual else None, residual_sum=rsum if residual else None, out_sum=dxsum,
    )  # fmt: skip
    want_dx = x.grad + r if residual else x.grad
    torch.testing.assert_close(dx, want_dx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw, w.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, b.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dxsum, want_dx.sum(0), rtol=1e-4, atol=1e-4)
    if residual:
        torch.testing.assert_close(rsum, r.sum(0), rtol=1e-5, atol=1e-5)


@needs_kernels
@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 40), n=st.sampled_from([1, 7, 64, 384]))
def test_bias_gelu_matches_aten(m, n):
    h, bias = randn(m, n, seed=0) * 4, randn(n, seed=1)
    before = h.clone()
    out = torch.empty(m, n)
    native.bias_gelu(h, bias, out=out)
    torch.testing.assert_close(out, F.gelu(h + bias), rtol=1e-5, atol=2e-6)
    assert torch.equal(h, before)  # the product stays without its bias


@needs_kernels
@pytest.mark.parametrize("in_place", [False, True])
def test_gelu_backward_matches_autograd(threads, in_place):
    m, n = 257, 96
    h, bias, g = randn(m, n, seed=0) * 4, randn(n, seed=1), randn(m, n, seed=2)
    pre = (h + bias).requires_grad_(True)
    F.gelu(pre).backward(g)
    out = g.clone() if in_place else torch.empty(m, n)
    dbias = torch.empty(n)
    native.gelu_backward(out if in_place else g, h, bias, out=out, bias_grad=dbias)
    torch.testing.assert_close(out, pre.grad, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(dbias, pre.grad.sum(0), rtol=1e-4, atol=1e-4)


def test_kernels_reject_what_they_cannot_read():
    if not native.available():
        pytest.skip("no kernels")
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="contiguous float32"):
        native.bias_gelu(x.t(), torch.zeros(4), out=torch.empty(8, 4))
    with pytest.raises(ValueError, match="contiguous float32"):
        native.bias_gelu(x.double(), torch.zeros(8), out=torch.empty(4, 8))


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """The loader as in a new process, with its cache in ``tmp_path``."""
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    return tmp_path


def test_off_switch_and_missing_compiler_fall_back_to_aten(fresh_loader, monkeypatch):
    monkeypatch.setenv("VITLAB_NATIVE", "0")
    assert native.kernels() is None
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.delenv("VITLAB_NATIVE")
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.kernels() is None
    assert not list(fresh_loader.rglob("*.so"))
    with pytest.raises(RuntimeError, match="not available"):
        native.bias_gelu(torch.zeros(1, 1), torch.zeros(1), out=torch.empty(1, 1))


def test_a_failed_build_falls_back_and_leaves_no_file(fresh_loader, monkeypatch):
    if shutil.which("cc") is None:
        pytest.skip("no cc")
    monkeypatch.setattr(native, "_FLAGS", (*native._FLAGS, "-DVITLAB_BROKEN", "-include", "/nonexistent.h"))
    assert native.kernels() is None
    assert not [p for p in fresh_loader.rglob("*") if p.is_file()]


def test_build_is_cached_by_source_and_flags(fresh_loader, monkeypatch):
    if shutil.which("cc") is None:
        pytest.skip("no cc")
    assert native.kernels() is not None
    built = sorted(fresh_loader.rglob("*.so"))
    assert len(built) == 1
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native.subprocess, "run", _no_compile(native.subprocess.run))
    assert native.kernels() is not None  # loaded from the cache, no compiler run
    assert sorted(fresh_loader.rglob("*.so")) == built


def test_cache_key_tells_apart_cpus_of_one_model_name_with_other_instruction_sets(monkeypatch):
    """``-march=native`` code from a CPU with AMX must not be loaded on one without it, even where
    both report the same model name (these VMs say "Intel(R) Xeon(R) Processor")."""
    if shutil.which("cc") is None:
        pytest.skip("no cc")
    cc, source = native._compiler(), native._SOURCE.read_bytes()
    cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f {}\n"
    keys = []
    for extra in ("", "amx_tile amx_bf16"):
        monkeypatch.setattr(native.Path, "read_text", lambda self, e=extra: cpuinfo.format(e))
        keys.append(native._key(cc, source))
    assert keys[0] != keys[1]


def _no_compile(run):
    def guarded(cmd, *args, **kwargs):
        assert "--version" in cmd, f"compiled again: {cmd}"
        return run(cmd, *args, **kwargs)

    return guarded


# -- Workspace.returned --------------------------------------------------------------------


def test_returned_buffer_is_reused_only_when_nobody_holds_it():
    ws = Workspace()
    like = torch.empty(0)
    a = ws.returned("out", (4, 3), like)
    assert ws.returned("out", (4, 3), like) is a  # only the workspace refers to it
    view = a.view(12)
    b = ws.returned("out", (4, 3), like)
    assert b is not a  # a view of it is alive
    del view
    assert ws.returned("out", (4, 3), like) is b
    assert ws.returned("out", (2, 3), like).shape == (2, 3)  # another batch size
    ws.clear()
    assert ws.nbytes() == 0


@needs_kernels  # the ATen LayerNorm backward returns fresh memory
def test_block_output_and_input_gradient_reuse_memory_between_steps():
    """A training loop gets the same memory for a block's output and input gradient every step;
    an output or a gradient someone keeps is never overwritten."""
    torch.manual_seed(0)
    blk = Block(dim=16, num_heads=2, mlp_dim=32).train()

    def step(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        out = blk(x)
        out.square().sum().backward()
        return out.detach(), x.grad

    ptrs = [tuple(t.data_ptr() for t in step(0))]
    ptrs.append(tuple(t.data_ptr() for t in step(1)))
    assert ptrs[1] == ptrs[0]  # nothing held them: reused
    kept = step(2)
    copies = [t.clone() for t in kept]
    assert tuple(t.data_ptr() for t in kept) == ptrs[0]
    later = step(3)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(later, kept))  # held: fresh memory instead
    for t, c in zip(kept, copies):
        torch.testing.assert_close(t, c, rtol=0, atol=0)
