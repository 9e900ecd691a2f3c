"""Known-answer tests of the paper's analyses (Fig. 6, Fig. 7) and of `vitlab inspect`."""

from __future__ import annotations

import base64
import io
import json
import math
import re

import numpy as np
import pytest
import torch

import vitlab
from vitlab.inspect import (
    attention_distance,
    attention_rollout,
    filter_pca,
    output_token_attention,
    patch_centers,
    patch_position_embeddings,
    posemb_similarity,
    rollout_map,
)


def _tiny(**kw):
    torch.manual_seed(0)
    kw = {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 3, **kw}
    return vitlab.create_model("vit_ti16", **kw).eval()


def _attn_from_patch_weights(w: torch.Tensor, prefix: int = 1, cls_mass: float = 0.0) -> torch.Tensor:
    """(N, N) patch-to-patch weights -> (1, 1, T, T) rows summing to one, ``cls_mass`` on the class token."""
    n = w.shape[0]
    t = n + prefix
    a = torch.zeros(1, 1, t, t, dtype=torch.float64)
    if prefix:
        a[0, 0, 0, :] = 1.0 / t
        a[0, 0, prefix:, 0] = cls_mass
    a[0, 0, prefix:, prefix:] = w / w.sum(dim=1, keepdim=True) * (1 - cls_mass)
    return a


# -- mean attention distance (Fig. 7 right) -------------------------------------------------------


def test_patch_centers_are_pixel_centres():
    c = patch_centers((2, 3), 8)
    assert c.shape == (6, 2)
    assert c[0].tolist() == [3.5, 3.5]
    assert c[5].tolist() == [11.5, 19.5]


def test_attention_to_self_only_gives_distance_zero():
    a = _attn_from_patch_weights(torch.eye(16, dtype=torch.float64), cls_mass=0.3)
    d = attention_distance([a, a], grid=(4, 4), patch_size=8)
    assert d.shape == (2, 1)
    assert torch.all(d == 0)


def test_uniform_attention_gives_mean_pairwise_grid_distance():
    # 2x2 grid of 8 px patches: from any patch, distances 0, 8, 8, 8*sqrt(2).
    a = torch.full((3, 2, 5, 5), 1 / 5)
    d = attention_distance(a, grid=(2, 2), patch_size=8)
    assert d.shape == (1, 2)
    assert d[0].tolist() == pytest.approx([4 + 2 * math.sqrt(2)] * 2, abs=1e-5)
    # 4x4 grid, brute force over all pairs.
    centers = [(r, c) for r in range(4) for c in range(4)]
    want = np.mean([16 * math.dist(p, q) for p in centers for q in centers])
    d = attention_distance(torch.full((1, 1, 17, 17), 1 / 17), grid=(4, 4), patch_size=16)
    assert float(d[0, 0]) == pytest.approx(want, rel=1e-6)


def test_neighbour_attention_per_head_and_no_class_token():
    # Head 0 looks one patch to the right (self on the last column), head 1 at itself.
    gh, gw, p = 3, 3, 10
    right = torch.zeros(9, 9, dtype=torch.float64)
    for r in range(gh):
        for c in range(gw):
            right[r * gw + c, r * gw + min(c + 1, gw - 1)] = 1
    a = torch.stack([right, torch.eye(9, dtype=torch.float64)])[None]
    d = attention_distance([a], grid=(gh, gw), patch_size=p, num_prefix_tokens=0)
    assert d[0].tolist() == pytest.approx([p * 6 / 9, 0.0])


def test_attention_distance_rejects_wrong_token_count():
    with pytest.raises(ValueError, match="patch grid"):
        attention_distance(torch.full((1, 1, 10, 10), 0.1), grid=(4, 4), patch_size=8)


# -- attention rollout (Fig. 6) ---------------------------------------------------------------------


def test_rollout_of_identity_attention_keeps_each_token_on_itself():
    eye = torch.eye(17).expand(2, 3, 17, 17)
    r = attention_rollout([eye] * 4)
    assert torch.equal(r, torch.eye(17).expand(2, 17, 17))
    r = attention_rollout([eye] * 4, residual=False)
    assert torch.equal(r, torch.eye(17).expand(2, 17, 17))


def test_rollout_of_uniform_attention_closed_form():
    # (0.5 U + 0.5 I)^L = 0.5^L I + (1 - 0.5^L) U because U is idempotent.
    t, layers = 5, 3
    u = torch.full((1, 2, t, t), 1 / t)
    r = attention_rollout([u] * layers)
    want = 0.5**layers * torch.eye(t) + (1 - 0.5**layers) / t
    assert torch.allclose(r[0], want, atol=1e-6)


def test_rollout_multiplies_later_layers_on_the_left_and_averages_heads():
    g = torch.Generator().manual_seed(0)
    a1 = torch.rand(1, 2, 4, 4, generator=g).softmax(-1)
    a2 = torch.rand(1, 2, 4, 4, generator=g).softmax(-1)
    r = attention_rollout([a1, a2], residual=False)
    want = a2[0].double().mean(0) @ a1[0].double().mean(0)
    assert torch.allclose(r[0].double(), want, atol=1e-6)
    res = [(a.double().mean(1)[0] + torch.eye(4, dtype=torch.float64)) / 2 for a in (a1, a2)]
    assert torch.allclose(attention_rollout([a1, a2])[0].double(), res[1] @ res[0], atol=1e-6)


def test_rollout_map_class_token_and_gap():
    # Class token attends only to patch 2 in one layer (no residual): the map is one-hot on patch 2.
    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, 0, 3] = 1
    a[0, 0, 1:, 0] = 1
    m = rollout_map([a], grid=(2, 2), residual=False)
    assert m.shape == (1, 2, 2)
    assert m[0].flatten().tolist() == [0, 0, 1, 0]
    # gap: the "output token" is the mean over the tokens.
    b = torch.zeros(1, 1, 4, 4)
    b[0, 0, :, 1] = 1
    m = rollout_map([b], grid=(2, 2), num_prefix_tokens=0, residual=False)
    assert m[0].flatten().tolist() == [0, 1, 0, 0]


def test_output_token_attention_is_head_mean_of_class_row():
    g = torch.Generator().manual_seed(1)
    attns = [torch.rand(2, 3, 5, 5, generator=g).softmax(-1) for _ in range(3)]
    maps = output_token_attention(attns, grid=(2, 2))
    assert maps.shape == (3, 2, 2, 2)
    assert torch.allclose(maps[1, 0].flatten(), attns[1][0, :, 0, 1:].mean(0))


def test_rollout_on_a_real_model_is_row_stochastic():
    m = _tiny()
    x = torch.randn(2, 3, 32, 32)
    _, attns = m(x, return_attention=True)
    r = attention_rollout(attns)
    assert torch.allclose(r.sum(-1), torch.ones(2, 17), atol=1e-5)
    maps = rollout_map(attns, grid=(4, 4))
    assert maps.shape == (2, 4, 4)
    assert maps.flatten(1).amax(1).tolist() == pytest.approx([1.0, 1.0])


# -- embeddings (Fig. 7 left, centre) ----------------------------------------------------------------


def test_filter_pca_recovers_a_constructed_filter_bank():
    c, p, d = 3, 4, 64
    dim = c * p * p
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(dim, 2, generator=g, dtype=torch.float64))
    u, v = q[:, 0], q[:, 1]
    u = u * torch.sign(u[u.abs().argmax()])  # sign convention: largest entry positive
    v = v * torch.sign(v[v.abs().argmax()])
    # Zero-mean orthogonal coefficient vectors with variances 9 and 1.
    h, _ = torch.linalg.qr(
        torch.cat([torch.ones(d, 1, dtype=torch.float64), torch.randn(d, 2, generator=g, dtype=torch.float64)], 1)
    )
    a, b = 3 * h[:, 1], h[:, 2]
    offset = torch.randn(dim, generator=g, dtype=torch.float64)  # the mean filter is removed first
    bank = (a[:, None] * u + b[:, None] * v + offset).reshape(d, c, p, p)
    comps, explained = filter_pca(bank.float(), 28)
    assert comps.shape == (28, c, p, p)
    assert explained[:2].tolist() == pytest.approx([0.9, 0.1], abs=1e-4)
    assert float(explained[2:].sum()) < 1e-6  # a rank-2 bank: nothing left
    assert torch.allclose(comps[0].flatten().double(), u, atol=1e-4)
    assert torch.allclose(comps[1].flatten().double(), v, atol=1e-4)


@pytest.mark.slow
def test_filter_pca_of_a_model_gives_28_unit_components():
    m = vitlab.create_model("vit_ti16", img_size=32, depth=1, num_classes=0)
    comps, explained = filter_pca(m.patch_embed.proj.weight, 28)
    assert comps.shape == (28, 3, 16, 16)
    assert torch.allclose(comps.flatten(1).norm(dim=1), torch.ones(28), atol=1e-5)
    assert bool(torch.all(explained[:-1] >= explained[1:]))
    assert 0 < float(explained.sum()) < 1


def test_posemb_similarity_of_orthogonal_row_and_column_embeddings():
    # learn2d with one-hot rows and columns: cos = 0.5 [same row] + 0.5 [same column].
    m = _tiny(posemb="learn2d")
    with torch.no_grad():
        m.pos_embed_row.zero_()
        m.pos_embed_col.zero_()
        for i in range(4):
            m.pos_embed_row[0, i, i] = 1
            m.pos_embed_col[0, i, i] = 1
    pe = patch_position_embeddings(m)
    sim = posemb_similarity(pe, (4, 4))
    assert sim.shape == (4, 4, 4, 4)
    r, c = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    for r0, c0 in [(0, 0), (1, 2), (3, 3)]:
        want = 0.5 * (r == r0).float() + 0.5 * (c == c0).float()
        assert torch.allclose(sim[r0, c0], want, atol=1e-6)


def test_patch_position_embeddings_drop_the_class_row():
    m = _tiny()
    with torch.no_grad():
        m.pos_embed.copy_(torch.eye(17, 192)[None])
    pe = patch_position_embeddings(m)
    assert pe.shape == (16, 192)
    assert torch.equal(pe, torch.eye(17, 192)[1:])
    assert torch.equal(posemb_similarity(pe, (4, 4)).reshape(16, 16), torch.eye(16))
    assert patch_position_embeddings(_tiny(posemb="none")) is None
    assert patch_position_embeddings(_tiny(posemb="sincos2d")).shape == (16, 192)


# -- report and CLI ------------------------------------------------------------------------------------


def _check_html(html: str, min_images: int) -> None:
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) >= min_images
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<script" not in html and "href=" not in html and "url(" not in html
    from PIL import Image

    for s in srcs:
        with Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))) as im:
            assert im.format == "PNG" and im.size[0] > 50


@pytest.mark.slow
def test_inspect_model_writes_figures_json_and_self_contained_html(tmp_path):
    from vitlab.inspect.images import digits_images
    from vitlab.inspect.report import inspect_model

    m = _tiny()
    imgs, names = digits_images(6)
    res = inspect_model(m, imgs[:2], tmp_path, names=names[:2], distance_images=imgs, progress=False)
    for f in (
        "filters_pca.png",
        "posemb_similarity.png",
        "attention_distance.png",
        "attention_rollout.png",
        "layer_attention.png",
    ):
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_html((tmp_path / "report.html").read_text(), 5)
    saved = json.loads((tmp_path / "inspect.json").read_text())
    assert saved["mean_attention_distance"]["num_images"] == 6
    # The reported numbers are the library function's on the same batch.
    from vitlab.inspect.images import preprocess

    x, _ = preprocess(imgs, img_size=(32, 32), in_chans=3, mean=m.config.mean, std=m.config.std)
    with torch.no_grad():
        _, attns = m(x, return_attention=True)
    want = attention_distance(attns, grid=(4, 4), patch_size=8)
    got = torch.tensor(res["mean_attention_distance"]["per_layer_head"])
    assert got.shape == (2, 3)
    assert torch.allclose(got, want, atol=1e-3)
    assert saved["mean_attention_distance"]["uniform_attention_distance"] == pytest.approx(
        float(torch.cdist(patch_centers((4, 4), 8), patch_centers((4, 4), 8)).mean()), abs=1e-3
    )


def _png(path, color):
    from PIL import Image

    Image.new("RGB", (120, 80), color).save(path)


@pytest.mark.slow
def test_cli_inspect_on_a_train_run_folder_includes_curves_and_confusion(tmp_path, capsys):
    from vitlab.cli import main

    run = tmp_path / "run"
    vitlab.save(_tiny(), run / "model")
    _png(run / "curves.png", "red")
    _png(run / "confusion.png", "blue")
    _png(run / "health.png", "green")  # vitlab train --watch-attention
    (run / "summary.json").write_text(json.dumps({"best_accuracy": 0.93, "epochs": 5, "history": [1, 2]}))
    out = tmp_path / "out"
    args = ["--num-images", "3", "--show", "2", "--out", str(out)]
    assert main(["inspect", "--model", str(run), "--data", "digits", *args]) == 0  # (its model records no data)
    html = (out / "report.html").read_text()
    _check_html(html, 8)
    assert "Training curves" in html and "Confusion matrix" in html and "best_accuracy" in html
    assert html.index("Training curves") < html.index("Attention health") < html.index("Confusion matrix")
    assert "report.html" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_inspect_with_image_files_and_errors(tmp_path, capsys):
    from vitlab.cli import main

    vitlab.save(_tiny(pool="gap", class_token=False), tmp_path / "gap")
    _png(tmp_path / "a.png", "green")
    _png(tmp_path / "b.png", "white")
    out = tmp_path / "out"
    assert (
        main(
            [
                "inspect",
                "--model",
                str(tmp_path / "gap"),
                "--image",
                str(tmp_path / "a.png"),
                str(tmp_path / "b.png"),
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["images"] == ["a.png", "b.png"]
    assert res["mean_attention_distance"]["num_images"] == 2
    assert (
        main(["inspect", "--model", str(tmp_path / "gap"), "--image", str(tmp_path / "missing.jpg"), "--out", str(out)])
        == 2
    )
    assert "missing.jpg: no such file or folder" in capsys.readouterr().err
    # the images as vitlab predict takes them, after the options (was "unrecognized arguments"); --image adds to them
    argv = [
        "inspect",
        "--model",
        str(tmp_path / "gap"),
        "--out",
        str(tmp_path / "pos"),
        "--json",
        str(tmp_path / "b.png"),
    ]
    assert main([*argv, "--image", str(tmp_path / "a.png")]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == ["a.png", "b.png"]
    assert main(["inspect", "--model", "no_such_model", "--out", str(out)]) == 2
    assert "no_such_model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "size", "grid"),
    [("vit_r_ti16", 64, (2, 2)), pytest.param("axial_vit_b16", 32, (2, 2), marks=pytest.mark.slow)],  # B/16: seconds
)
def test_inspect_model_on_hybrid_and_axial_models(tmp_path, name, size, grid):
    from vitlab.inspect.images import digits_images
    from vitlab.inspect.report import inspect_model

    torch.manual_seed(0)
    m = vitlab.create_model(name, img_size=size, num_classes=3, depth=2, embed_dim=64, num_heads=2, mlp_dim=64).eval()
    assert m.patch_embed.grid(size, size) == grid
    imgs, _ = digits_images(2)
    res = inspect_model(m, imgs, tmp_path, progress=False)
    assert np.array(res["mean_attention_distance"]["per_layer_head"]).shape == (2, 2)
    assert res["mean_attention_distance"]["pixels_per_patch"] == size / grid[0]
    html = (tmp_path / "report.html").read_text()
    _check_html(html, 4)
    # A hybrid's patch projection sees CNN features, not pixels: Fig. 7 left is skipped, with the reason.
    assert ("Skipped" in html) == name.startswith("vit_r")
    assert (tmp_path / "filters_pca.png").exists() != name.startswith("vit_r")
