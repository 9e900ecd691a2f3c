"""Property-based tests (hypothesis) over random small architectures.

Position-embedding resampling over random grids (shape, identity, corners in the JAX mode)
is covered in tests/test_posemb.py; here: the patch embedding against Eq. 1's explicit
reshape, and every checkpoint format over random architectures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vitlab
from conftest import assert_close_rel
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.models.layers import PatchEmbed


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    chans=st.integers(1, 4),
    patch=st.integers(1, 6),
    gh=st.integers(1, 4),
    gw=st.integers(1, 4),
    dim=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_patch_embedding_is_the_flattened_patches_times_e(batch, chans, patch, gh, gw, dim, seed):
    """Eq. 1: x_p in R^{N x (P^2 C)}, rows in row-major patch order, times E in R^{(P^2 C) x D}, plus the bias."""
    g = torch.Generator().manual_seed(seed)
    pe = PatchEmbed(patch_size=patch, in_chans=chans, embed_dim=dim)
    with torch.no_grad():
        pe.proj.weight.copy_(torch.randn(pe.proj.weight.shape, generator=g))
        pe.proj.bias.copy_(torch.randn(dim, generator=g))
    x = torch.randn(batch, chans, gh * patch, gw * patch, generator=g, dtype=torch.float64)
    # (B, C, gh, P, gw, P) -> (B, gh, gw, C, P, P) -> (B, N, C*P*P): flattened patches,
    # channel-major like the conv weight
    xp = (
        x.reshape(batch, chans, gh, patch, gw, patch)
        .permute(0, 2, 4, 1, 3, 5)
        .reshape(batch, gh * gw, chans * patch * patch)
    )
    e = pe.proj.weight.double().reshape(dim, chans * patch * patch).T
    want = xp @ e + pe.proj.bias.double()
    got = pe.double()(x)
    assert got.shape == (batch, gh * gw, dim)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


archs = st.fixed_dictionaries(
    {
        "patch_size": st.sampled_from([2, 4]),
        "grid": st.integers(1, 4),
        "num_heads": st.integers(1, 3),
        "head_dim": st.sampled_from([2, 4, 8]),
        "depth": st.integers(1, 3),
        "mlp_ratio": st.sampled_from([1, 2, 4]),
        "num_classes": st.integers(1, 5),
        "seed": st.integers(0, 1000),
    }
)


def _random_vit(a) -> VisionTransformer:
    d = a["num_heads"] * a["head_dim"]
    cfg = ViTConfig(
        img_size=a["grid"] * a["patch_size"],
        patch_size=a["patch_size"],
        embed_dim=d,
        depth=a["depth"],
        num_heads=a["num_heads"],
        mlp_dim=d * a["mlp_ratio"],
        num_classes=a["num_classes"],
        act="gelu_tanh",  # what the npz loader assumes (the official JAX models)
    )
    m = VisionTransformer(cfg)
    g = torch.Generator().manual_seed(a["seed"])
    with torch.no_grad():
        for name, p in m.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0  # LayerNorm scales around 1
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
    return m.eval()


def _outputs(model, a, seed=0):
    x = torch.randn(
        2, 3, a["grid"] * a["patch_size"], a["grid"] * a["patch_size"], generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        return model(x)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=archs)
def test_every_format_round_trips_a_random_architecture(tmp_path_factory, a):
    """vitlab folder, timm .safetensors / .pth / .bin, Google .npz: the same outputs after a round trip."""
    from safetensors.torch import save_file

    npz_writer = pytest.importorskip("test_checkpoints_npz")  # the test-suite's npz writer (vit_jax layout)
    tmp = tmp_path_factory.mktemp("fmt")
    src = _random_vit(a)
    want = _outputs(src, a)
    assert want.abs().max() > 1e-3
    heads = a["num_heads"]
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    save_file(sd, str(tmp / "timm.safetensors"))
    torch.save(sd, tmp / "timm.pth")
    torch.save({"model": sd, "epoch": 3}, tmp / "wrapped.bin")
    old_heads = npz_writer.HEADS
    npz_writer.HEADS = heads  # the writer splits q/k/v per head
    try:
        npz_writer.to_npz(src, tmp / "jax.npz", layout="vit_jax")
    finally:
        npz_writer.HEADS = old_heads
    sources = {
        "vitlab": (vitlab.save(src, tmp / "native"), {}),
        "timm.safetensors": (tmp / "timm.safetensors", {"num_heads": heads, "act": "gelu_tanh"}),
        "timm.pth": (tmp / "timm.pth", {"num_heads": heads, "act": "gelu_tanh"}),
        "wrapped.bin": (tmp / "wrapped.bin", {"num_heads": heads, "act": "gelu_tanh"}),
        "npz": (tmp / "jax.npz", {}),
    }
    for n, (name, (path, overrides)) in enumerate(sources.items()):
        got = vitlab.load(path, **overrides)
        c = got.config
        assert (c.embed_dim, c.depth, c.num_heads, c.mlp_dim, c.patch_size, c.num_classes) == (
            src.config.embed_dim,
            src.config.depth,
            heads,
            src.config.mlp_dim,
            src.config.patch_size,
            a["num_classes"],
        ), name
        assert_close_rel(_outputs(got, a), want, msg=name)
        again = vitlab.load(vitlab.save(got, tmp / f"again{n}"))  # and back to the vitlab folder
        assert torch.equal(_outputs(again, a), _outputs(got, a)), name


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=archs)
def test_hugging_face_round_trip_of_a_random_architecture(tmp_path_factory, a):
    transformers = pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("hf")
    d = a["num_heads"] * a["head_dim"]
    cfg = transformers.ViTConfig(
        image_size=a["grid"] * a["patch_size"],
        patch_size=a["patch_size"],
        hidden_size=d,
        num_hidden_layers=a["depth"],
        num_attention_heads=a["num_heads"],
        intermediate_size=d * a["mlp_ratio"],
        num_labels=a["num_classes"],
    )
    torch.manual_seed(a["seed"])
    ref = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.2 * torch.randn_like(p))
    ref.save_pretrained(tmp)
    model = vitlab.load(tmp)
    x = torch.randn(
        2, 3, a["grid"] * a["patch_size"], a["grid"] * a["patch_size"], generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = ref(pixel_values=x).logits
        got = model(x)
    assert model.config.num_heads == a["num_heads"]
    assert_close_rel(got, want)
    again = vitlab.load(vitlab.save(model, tmp / "vitlab"))
    with torch.no_grad():
        assert torch.equal(again(x), got)
    np.testing.assert_array_equal(list(model.config.img_size), [a["grid"] * a["patch_size"]] * 2)
