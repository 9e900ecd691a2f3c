"""The speedrun's model- and evaluation-side levers (issue 38): CCT's convolutional tokenizer and sequence pooling,
patch-whitening initialisation, test-time flip augmentation, and the Muon / AdamW parameter split."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from conftest import assert_close_rel
from vitlab import ConfigError, InputError, VisionTransformer, ViTConfig, accel
from vitlab.evaluate.accuracy import evaluate_batches, evaluate_model, tta_logits
from vitlab.models import create_model
from vitlab.models.flops import block_macs
from vitlab.models.hybrid import ConvTokenizer, StdConv2d
from vitlab.models.whiten import patch_moments, whiten_init_
from vitlab.optim_groups import muon_split

CCT_TINY = dict(img_size=16, num_classes=5, depth=1, embed_dim=32, num_heads=2, mlp_dim=64)
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=4)


def randomised(model: nn.Module, seed: int = 0, scale: float = 0.2) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


def correlated_images(n: int = 48, size: int = 16, seed: int = 0) -> torch.Tensor:
    """Images whose neighbouring pixels and channels are correlated (as natural images' are), so whitening has
    work to do: smoothed noise, a shared grey level per image, plus a little independent noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="circular"), 3, stride=1)
    x = x + 0.5 * torch.randn(n, 1, size, size, generator=g) + 0.3 * torch.randn(n, 1, 1, 1, generator=g)
    return x + 0.05 * torch.randn(x.shape, generator=g)


# --- the convolutional tokenizer (CCT) ---------------------------------------------------------------------------

# CCT's CIFAR models at 32 px, 10 classes, as its code builds them: 3x3 convolutions without bias, blocks whose qkv
# have no bias, learned position embeddings for 32 / 2**n squared tokens, sequence pooling (D + 1), the head.
# (Hassani et al. 2021, Table 1: CCT-7/3x1 has 3.76 M parameters.)
CCT_PARAMS = {
    "vit_cct6_3x1": 3_233_803,
    "vit_cct6_3x2": 3_326_923,
    "vit_cct7_3x1": 3_760_139,
    "vit_cct7_3x2": 3_853_259,
}


@pytest.mark.parametrize("name", list(CCT_PARAMS))
def test_cct_param_counts(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name, img_size=32, num_classes=10)
    assert model.num_params() == model.config.num_params() == CCT_PARAMS[name]
    cfg = model.config
    assert (cfg.stem, cfg.pool, cfg.class_token, cfg.qkv_bias, cfg.patch_size) == ("conv", "seq", False, False, 1)


def test_cct_names_are_listed_with_their_counts() -> None:
    from vitlab.commands.models import model_table

    assert {"vit_cct7_3x1", "vit_cct7_3x2"} <= set(vitlab.list_models())
    (row,) = model_table(img_size=32, num_classes=10, names=["vit_cct7_3x1"])
    assert row["params"] == 3_760_139 and row["layers"] == 7 and row["width"] == 256 and row["heads"] == 4
    assert row["mlp"] == 512


@pytest.mark.parametrize(
    ("fields", "convs"),
    [
        (dict(stem_layers=3, stem_width=8), [(8, 3), (8, 8), (32, 8)]),
        (dict(stem_layers=2, class_token=True, pool="cls", posemb="learn2d"), [(64, 3), (32, 64)]),
    ],
)
def test_conv_stem_config_counts_what_it_builds(fields: dict, convs: list) -> None:
    cfg = ViTConfig(**{**CCT_TINY, "stem": "conv", "patch_size": 1, "class_token": False, "pool": "seq", **fields})
    model = VisionTransformer(cfg)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    assert [tuple(c.weight.shape[:2]) for c in model.patch_embed.convs] == convs


def test_tokenizer_is_conv_relu_and_overlapping_max_pool() -> None:
    """Each layer: 3x3 convolution (stride 1, zero padding 1, no bias), ReLU, 3x3 max-pool of stride 2 and padding 1,
    written out here from patches and window maxima."""
    tok = randomised(ConvTokenizer(layers=2, width=6, in_chans=3, embed_dim=8), scale=0.5)
    x = torch.randn(2, 3, 12, 10)
    y = x
    for conv in tok.convs:
        b, _, h, w = y.shape
        cols = F.unfold(y, 3, padding=1)  # (B, C * 9, H * W)
        y = (conv.weight.reshape(conv.out_channels, -1) @ cols).reshape(b, -1, h, w).clamp(min=0)
        windows = F.unfold(F.pad(y, (1, 1, 1, 1), value=float("-inf")), 3, stride=2)  # (B, C' * 9, cells)
        y = windows.reshape(b, y.shape[1], 9, -1).amax(2).reshape(b, y.shape[1], (h + 1) // 2, (w + 1) // 2)
    assert tok.grid(12, 10) == (3, 3) and tok.grid(13, 9) == (4, 3)
    assert_close_rel(tok(x), y.flatten(2).transpose(1, 2))


def test_cct_runs_at_other_sizes_and_trains() -> None:
    model = create_model("vit_cct7_3x2", **CCT_TINY)
    assert model.config.grid_size == (4, 4) and model.pos_embed.shape == (1, 16, 32)
    out = model(torch.randn(2, 3, 16, 16))
    out.sum().backward()
    assert out.shape == (2, 5) and model.patch_embed.convs[0].weight.grad is not None
    assert model.seq_pool.score.weight.grad is not None
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 24, 20)).shape == (1, 5)  # 6 x 5 tokens, position embeddings resampled


def test_cct_saves_loads_and_its_config_round_trips(tmp_path) -> None:
    model = randomised(create_model("vit_cct7_3x1", **CCT_TINY)).eval()
    again = ViTConfig.from_json(model.config.to_json())
    assert again == model.config and json.loads(model.config.to_json())["stem"] == "conv"
    vitlab.save(model, tmp_path / "m")
    loaded = vitlab.load(tmp_path / "m")
    assert loaded.config == model.config and type(loaded) is accel.FastVisionTransformer
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert_close_rel(loaded(x), model(x))


def test_cct_macs_count_the_tokenizer_not_a_projection() -> None:
    with torch.device("meta"):
        model = create_model("vit_cct7_3x1", img_size=32, num_classes=10)
    cfg = model.config
    tokenizer = 32 * 32 * 3 * 256 * 9  # one conv at full size, then the pool halves each side: 16 x 16 tokens
    expected = tokenizer + 7 * block_macs(cfg, 256) + 2 * 256 * 256 + 256 * 10  # blocks, sequence pooling, head
    assert model.macs() == expected


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(patch_size=4), "stem: 'conv' makes the tokens itself"),
        (dict(hybrid_layers=()), "stem: 'conv' makes the tokens itself"),
        (dict(stem_layers=0), r"stem_layers: must be in 1\.\.6, got 0"),
        (dict(stem_layers=7), r"stem_layers: must be in 1\.\.6, got 7"),
        (dict(stem_layers=2**40), "stem_layers: .* out of range"),
        (dict(stem_width=0), "stem_width: must be positive"),
        (dict(stem_width="8"), "stem_width: expected an integer"),
        (dict(stem="resnet"), "stem: 'resnet' is not one of patch, conv"),
        (dict(pool="seqpool"), "pool: 'seqpool' is not one of cls, gap, map, seq"),
    ],
)
def test_bad_conv_stem_config_names_the_field(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ViTConfig(**{**CCT_TINY, "stem": "conv", "patch_size": 1, "class_token": False, "pool": "seq", **fields})


def test_accel_runs_the_cct_as_the_plain_model() -> None:
    plain = randomised(create_model("vit_cct7_3x1", **{**CCT_TINY, "depth": 2})).eval()
    fast = accel.accelerate(copy.deepcopy(plain))
    assert type(fast) is accel.FastVisionTransformer and type(fast.blocks[0]) is accel.FastBlock
    fast.inference_chunk_bytes = 1  # one image per chunk: the chunked path runs too
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert fast.inference_chunk_size(x) == 1
        assert_close_rel(fast(x), plain(x))
    plain.train()
    fast.train()
    assert_close_rel(fast(x), plain(x))


def test_first_conv_is_named_and_other_paths_refuse_the_conv_stem(tmp_path) -> None:
    from vitlab.checkpoints.npz_write import write_npz
    from vitlab.models.mpp import MaskedPatchPrediction

    model = create_model("vit_cct7_3x1", **CCT_TINY)
    assert model.get_submodule(model.pretrained_cfg["first_conv"]) is model.patch_embed.convs[0]
    assert model.global_pool == "seq"
    with pytest.raises(ValueError, match="needs a plain ViT"):
        MaskedPatchPrediction(model)
    with pytest.raises(ConfigError, match="stem: 'conv' has no vit_jax .npz layout"):
        write_npz(model, tmp_path / "m.npz")


# --- sequence pooling --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("class_token", [False, True])
def test_seq_pool_is_the_softmax_weighted_mean_of_the_patch_tokens(class_token: bool) -> None:
    model = randomised(VisionTransformer(**TINY, pool="seq", class_token=class_token)).eval()
    assert model.config.num_params() == sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 16 + class_token, 32)
    patches = x[:, int(class_token) :]
    w = torch.softmax(patches @ model.seq_pool.score.weight.T + model.seq_pool.score.bias, dim=1)  # (B, N, 1)
    assert_close_rel(model.forward_head(x, pre_logits=True), (w * patches).sum(1))
    assert_close_rel(model.forward_head(x), model.head((w * patches).sum(1)))


def test_seq_pool_with_constant_scores_is_gap_and_padding_is_never_pooled() -> None:
    seq = VisionTransformer(**TINY, pool="seq", class_token=False)
    gap = VisionTransformer(**TINY, pool="gap", class_token=False)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        seq.seq_pool.score.weight.zero_()
        assert_close_rel(seq.pool(x), gap.pool(x))
        randomised(seq.seq_pool)
        padded = torch.cat([x, 100 * torch.randn(2, 5, 32)], dim=1)  # (packed input: padding after each image)
        size = torch.cat([torch.ones(2, 16, 1), torch.zeros(2, 5, 1)], dim=1)
        assert_close_rel(seq.pool(padded, size), seq.pool(x))


def test_seq_pool_in_timms_api() -> None:
    model = VisionTransformer(**TINY, pool="seq", class_token=False)
    assert model.global_pool == "seq"
    model.reset_classifier(7, global_pool="avg")
    assert model.seq_pool is None and model(torch.randn(1, 3, 16, 16)).shape == (1, 7)
    with pytest.raises(ConfigError, match="global_pool: 'seq' needs a model built with it"):
        model.reset_classifier(7, global_pool="seq")
    tome = VisionTransformer(**TINY, pool="seq").eval()
    tome.set_tome(4)  # merged tokens weigh the scores by their sizes
    with torch.no_grad():
        assert tome(torch.randn(2, 3, 16, 16)).shape == (2, 4)


# --- patch-whitening initialisation ------------------------------------------------------------------------------


def output_cov(conv: nn.Conv2d, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and covariance of ``conv``'s outputs over every image and position."""
    with torch.no_grad():
        y = conv(images).double().transpose(0, 1).reshape(conv.out_channels, -1)
    return y.mean(1), torch.cov(y, correction=0)


def test_whitening_the_patch_embedding_gives_identity_covariance() -> None:
    images = correlated_images()
    model = VisionTransformer(**{**TINY, "embed_dim": 64})
    proj = model.patch_embed.proj  # Eq. 1's E: kernel = stride = 4, so 4 x 4 x 3 = 48 values a patch
    _, before = output_cov(proj, images)
    assert (before[:48, :48] - torch.eye(48, dtype=torch.float64)).abs().max() > 0.5
    untouched = proj.weight[48:].clone()
    assert whiten_init_(proj, images, eps=1e-6) == 48
    mean, cov = output_cov(proj, images)
    assert (cov[:48, :48] - torch.eye(48, dtype=torch.float64)).abs().max() < 1e-2
    assert mean[:48].abs().max() < 1e-4  # the bias centres the whitened channels
    assert torch.equal(proj.weight[48:], untouched)


def test_whitening_the_cct_tokenizer_with_negated_pairs() -> None:
    images = correlated_images(n=24)
    model = create_model("vit_cct7_3x1", **{**CCT_TINY, "embed_dim": 64})
    conv = model.get_submodule(model.pretrained_cfg["first_conv"])  # 3x3, padding 1: 27 values a patch
    assert whiten_init_(conv, images, eps=1e-6, negated=True) == 54
    _, cov = output_cov(conv, images)
    assert (cov[:27, :27] - torch.eye(27, dtype=torch.float64)).abs().max() < 1e-2
    assert torch.equal(conv.weight[27:54], -conv.weight[:27])
    with torch.no_grad():
        assert model(images[:2]).isfinite().all()


def test_whitening_fewer_channels_than_patch_values_keeps_the_largest_directions() -> None:
    images = correlated_images(n=16)
    conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
    assert whiten_init_(conv, images, eps=1e-6) == 8
    _, cov = output_cov(conv, images)
    assert (cov - torch.eye(8, dtype=torch.float64)).abs().max() < 1e-2
    _, patches = patch_moments(conv, images)
    top = torch.linalg.eigvalsh(patches).flip(0)[:8]
    filters = conv.weight.detach().double().reshape(8, -1)
    # each filter is an eigenvector scaled by 1 / sqrt(its eigenvalue): its squared norm is 1 / eigenvalue
    assert_close_rel(1 / filters.pow(2).sum(1), top, rtol=1e-4)


def test_patch_moments_do_not_depend_on_the_batch() -> None:
    images = correlated_images(n=10)
    conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
    one = patch_moments(conv, images, batch=3)
    whole = patch_moments(conv, images)
    assert_close_rel(one[0], whole[0], rtol=1e-12)
    assert_close_rel(one[1], whole[1], rtol=1e-12)


def test_whitening_refuses_what_it_cannot_whiten() -> None:
    images = correlated_images(n=4)
    with pytest.raises(ConfigError, match="plain nn.Conv2d, got a StdConv2d"):
        whiten_init_(StdConv2d(3, 8, 3), images)
    with pytest.raises(ConfigError, match="ungrouped"):
        whiten_init_(nn.Conv2d(3, 6, 3, groups=3), images)
    with pytest.raises(InputError, match=r"float images \(N, 1, H, W\)"):
        whiten_init_(nn.Conv2d(1, 4, 2), images)
    with pytest.raises(ConfigError, match="eps: must be a positive number"):
        whiten_init_(nn.Conv2d(3, 4, 2), images, eps=0.0)


# --- test-time flip augmentation ---------------------------------------------------------------------------------


class MirrorSymmetric(nn.Module):
    """Logits from the mean of each image row's mirror-symmetric sums: the same for an image and its mirror."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc((x + x.flip(-1))[..., :4].mean(2).flatten(1))


class LeftRight(nn.Module):
    """Two pixels, two classes: logit 0 is the left pixel, logit 1 three times the right one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0, 0] * torch.tensor([1.0, 3.0])


def test_flip_tta_leaves_a_mirror_symmetric_model_alone() -> None:
    model = randomised(MirrorSymmetric(), scale=1.0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(2)]
    plain = evaluate_batches(model, batches, num_classes=3, device=torch.device("cpu"))
    flip = evaluate_batches(model, batches, num_classes=3, device=torch.device("cpu"), tta="flip")
    assert plain["top1"] == flip["top1"] and plain["per_class"] == flip["per_class"]
    assert (plain["confusion"] == flip["confusion"]).all()
    assert abs(plain["loss"] - flip["loss"]) <= 1e-6 * abs(plain["loss"])


def test_flip_tta_averages_the_logits_and_can_change_a_prediction() -> None:
    x = torch.tensor([[[[1.0, 0.3]]]])  # left 1.0, right 0.3: logits (1.0, 0.9), class 0
    model = LeftRight()
    assert model(x).argmax(1).item() == 0 and model(x.flip(-1)).argmax(1).item() == 1  # mirror: (0.3, 3.0)
    assert_close_rel(tta_logits(model, x, "flip"), torch.tensor([[0.65, 1.95]]))  # logits, not softmaxes, averaged
    batches = [(x, torch.tensor([1]))]
    assert evaluate_batches(model, batches, num_classes=2, device=torch.device("cpu"))["top1"] == 0.0
    res = evaluate_batches(model, batches, num_classes=2, device=torch.device("cpu"), tta="flip")
    assert res["top1"] == 1.0
    assert res["loss"] == pytest.approx(F.cross_entropy(torch.tensor([[0.65, 1.95]]), torch.tensor([1])).item())
    with pytest.raises(ConfigError, match="tta: 'rotate' is not one of flip"):
        evaluate_batches(model, batches, num_classes=2, device=torch.device("cpu"), tta="rotate")


def test_vitlab_eval_tta_flip(tmp_path, capsys) -> None:
    from imagefolder import tiny_folder
    from vitlab.cli import main

    data = tiny_folder(tmp_path / "d", per_class=1, test_per_class=4)
    model = randomised(
        VisionTransformer(**{**TINY, "img_size": 8, "num_classes": 3}, class_names=["class0", "class1", "class2"])
    )
    vitlab.save(model, tmp_path / "m")
    cache = ["--cache-dir", str(tmp_path / "c")]
    results = {}
    for tta in ("none", "flip"):
        out = tmp_path / f"{tta}.json"
        assert (
            main(
                [
                    "eval",
                    "--model",
                    str(tmp_path / "m"),
                    "--data",
                    str(data),
                    *cache,
                    "--tta",
                    tta,
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        results[tta] = json.loads(out.read_text())
    assert "(flip TTA)" in capsys.readouterr().out
    assert results["flip"]["tta"] == "flip" and results["none"]["tta"] == "none"
    assert results["flip"]["loss"] != results["none"]["loss"]  # this model is not mirror-symmetric
    lib = evaluate_model(
        vitlab.load(tmp_path / "m"), str(data), cache_dir=str(tmp_path / "c"), progress=False, tta="flip"
    )
    assert lib["loss"] == pytest.approx(results["flip"]["loss"], rel=1e-6) and lib["top1"] == results["flip"]["top1"]


# --- Muon on the blocks' matrices, AdamW on the rest -------------------------------------------------------------


def test_muon_split_puts_the_block_matrices_to_muon() -> None:
    model = VisionTransformer(**TINY, pool="map", class_token=False, init_values=1e-4)
    model.pos_embed.requires_grad_(False)
    muon, adamw = muon_split(model)
    names = {n for n, _ in muon}
    assert names == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
    }
    rest = {n for n, _ in adamw}
    assert {"patch_embed.proj.weight", "head.weight", "attn_pool.q.weight", "blocks.0.ls1.gamma", "norm.weight"} <= rest
    assert "pos_embed" not in rest  # frozen: in neither
    assert names.isdisjoint(rest) and len(names | rest) == sum(1 for p in model.parameters() if p.requires_grad)
    cct = create_model("vit_cct7_3x1", **CCT_TINY)
    assert {n for n, _ in muon_split(cct)[1]} >= {"patch_embed.convs.0.weight", "seq_pool.score.weight", "pos_embed"}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="this torch has no torch.optim.Muon")
def test_muon_and_adamw_together_train_a_tiny_vit() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "img_size": 8, "depth": 1}, pool="gap", class_token=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    muon_params, adamw_params = muon_split(model)
    muon = torch.optim.Muon([p for _, p in muon_params], lr=0.02, weight_decay=0.0)
    adamw = torch.optim.AdamW([p for _, p in adamw_params], lr=3e-3, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(x), y)
        muon.zero_grad()
        adamw.zero_grad()
        loss.backward()
        muon.step()
        adamw.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    for name, p in (*muon_params, *adamw_params):
        assert not torch.equal(p, before[name]), f"{name} was not updated"
