"""DINOv3 in its three layouts (Meta's release, Hugging Face's ``DINOv3ViTModel``, timm's ``Eva``) and ``vitlab convert
--layout timm|hf|meta``: each layout loads to the same features (the class token after the final norm: Hugging
Face's ``pooler_output``, timm's ``global_pool="token"``), and what vitlab writes loads in the other library strictly
with the same outputs. Tiny random-initialised models."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_close_rel, slow_cases
from vitlab.checkpoints.layouts import write_layout
from vitlab.cli import main
from vitlab.errors import CheckpointError, OutputError

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

HF_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_register_tokens=4,
    image_size=32,
    patch_size=16,
)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = (name.endswith("weight") and p.ndim == 1) or "gamma" in name or "lambda" in name
            p.copy_(float(scale) + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def images(h: int = 32, w: int = 32, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(1))


def hf_dinov3(path, **changes):
    cfg = transformers.DINOv3ViTConfig(**{**HF_TINY, **changes})
    model = randomize(transformers.DINOv3ViTModel(cfg))
    model.save_pretrained(path)
    return model


def timm_dinov3(name="vit_small_patch16_dinov3_qkvb", **kw):
    args = dict(embed_dim=64, depth=2, num_heads=4, mlp_ratio=2, num_classes=0, global_pool="token", img_size=32)
    return timm.create_model(name, pretrained=False, **{**args, **kw}).eval()


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"use_gated_mlp": True, "hidden_act": "silu"},
        {"key_bias": True},
        {"num_register_tokens": 0, "query_bias": False, "value_bias": False, "proj_bias": False, "mlp_bias": False},
    ],
    ids=["qv_bias", "swiglu", "key_bias", "no_bias_no_registers"],
)
def test_hf_dinov3_folder_loads_with_its_pooler_output(changes, tmp_path):
    hf = hf_dinov3(tmp_path / "hf", **changes)
    model = vitlab.load(tmp_path / "hf")
    assert model.config.extra["family"] == "DINOv3" and model.config.pool == "cls"
    x = images(48, 32)  # any size: RoPE on normalised patch centres
    with torch.no_grad():
        out = hf(pixel_values=x)
        assert_close_rel(model(x), out.pooler_output)
        assert_close_rel(model.forward_features(x), out.last_hidden_state)


def test_hf_dinov3_converted_to_timm_loads_strictly_into_timms_qkvb_model(tmp_path, capsys):
    """The issue's check: a Hugging Face DINOv3 folder, `vitlab convert --layout timm`, timm's
    vit_small_patch16_dinov3_qkvb of the same size with load_state_dict(strict=True): the same features."""
    hf = hf_dinov3(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "timm"), "--layout", "timm"]) == 0
    assert "local-dir" in capsys.readouterr().err
    ref = timm_dinov3()
    ref.load_state_dict(safetensors_torch.load_file(str(tmp_path / "timm" / "model.safetensors")), strict=True)
    x = images()
    with torch.no_grad():
        want = hf(pixel_values=x).pooler_output
        assert_close_rel(ref(x), want)
        built = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()  # timm's config.json too
        assert built.global_pool == "token"
        assert_close_rel(built(x), want)
        assert_close_rel(vitlab.load(tmp_path / "timm")(x), want)  # and back into vitlab


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3_qkvb", "vit_small_plus_patch16_dinov3"])
def test_timm_dinov3_to_hugging_face_and_meta_and_back(name, tmp_path):
    ref = randomize(timm_dinov3(name, mlp_ratio=2 if "plus" not in name else 4))
    x = images()
    with torch.no_grad():
        want = ref(x)
    model = vitlab.load(dict(ref.state_dict()), num_heads=4)
    write_layout(model, tmp_path / "hf", layout="hf")
    hf = transformers.DINOv3ViTModel.from_pretrained(tmp_path / "hf").eval()
    pre = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == [0.485, 0.456, 0.406]  # DINOv3's normalisation travels with it
    write_layout(model, tmp_path / "meta.pth", layout="meta")
    meta = torch.load(tmp_path / "meta.pth", weights_only=True)
    assert {"storage_tokens", "mask_token", "rope_embed.periods", "blocks.0.ls1.gamma"} <= set(meta)
    from timm.models.eva import checkpoint_filter_fn  # timm's reader of Meta's release

    again = timm_dinov3(name, mlp_ratio=2 if "plus" not in name else 4)
    again.load_state_dict(checkpoint_filter_fn(meta, again), strict=True)
    with torch.no_grad():
        assert_close_rel(hf(pixel_values=x).pooler_output, want)
        assert_close_rel(again(x), want)
        assert_close_rel(vitlab.load(tmp_path / "meta.pth")(x), want)
        assert_close_rel(vitlab.load(tmp_path / "hf")(x), want)


def _write_meta(tmp_path, state):
    safetensors_torch.save_file(state, str(tmp_path / "meta.safetensors"))
    return tmp_path / "meta.safetensors"


def test_meta_layout_refusals(tmp_path):
    model = vitlab.load(dict(randomize(timm_dinov3()).state_dict()), num_heads=4)
    write_layout(model, tmp_path / "meta.safetensors", layout="meta")
    state = safetensors_torch.load_file(str(tmp_path / "meta.safetensors"))
    untied = {**state, "cls_norm.weight": torch.ones(64), "cls_norm.bias": torch.zeros(64)}
    with pytest.raises(CheckpointError, match="cls_norm"):
        vitlab.load(_write_meta(tmp_path, untied))
    minmax = {**state, "rope_embed.periods": torch.tensor([0.5, 3.0, 9.0, 100.0])}
    with pytest.raises(CheckpointError, match="min/max-period"):
        vitlab.load(_write_meta(tmp_path, minmax))
    bf16 = {**state, "rope_embed.periods": state["rope_embed.periods"].bfloat16()}  # as Meta stores them
    assert vitlab.load(_write_meta(tmp_path, bf16)).config.rope_theta == 100.0


def test_layouts_refuse_what_they_cannot_hold(tmp_path):
    dinov3 = vitlab.create_model("vit_small_patch16_dinov3", depth=1, num_classes=3)
    with pytest.raises(CheckpointError, match="num_classes 3.*--num-classes 0"):
        write_layout(dinov3, tmp_path / "hf", layout="hf")
    axial = vitlab.create_model("vit_s16", depth=1, rope=True, posemb="none")
    with pytest.raises(CheckpointError, match="rope_kind 'axial'"):
        write_layout(axial, tmp_path / "t", layout="timm")
    eva = vitlab.create_model("eva02_tiny_patch14_224", depth=1)
    with pytest.raises(CheckpointError, match="rope_kind 'eva'"):
        write_layout(eva, tmp_path / "m", layout="meta")
    assert not any(tmp_path.iterdir())  # refused before anything is written
    assert main(["convert", "nope.pth", str(tmp_path / "x.npz"), "--layout", "timm"]) == 2
    plain = vitlab.create_model("vit_ti16", depth=1, img_size=32)  # no RoPE: named so, not by its default rope_kind
    with pytest.raises(CheckpointError, match=r"^rope False, posemb 'learn', num_classes 1000: has no place"):
        write_layout(plain, tmp_path / "m", layout="meta")


def test_convert_says_what_stands_where_it_writes(tmp_path, capsys):
    """A file where DST's folder would be, or a folder where its file would be: one line each, on every layout, before
    the model is read (the hf and npz writers raised FileExistsError with a traceback)."""
    vitlab.save(vitlab.create_model("vit_ti16", depth=1, img_size=32), tmp_path / "m")
    (tmp_path / "notes").write_text("mine")
    (tmp_path / "box.npz").mkdir()
    cases = [
        (["notes", "--layout", "hf"], "notes: is a file, where vitlab writes the converted model.safetensors into"),
        (["notes/x", "--layout", "timm"], "notes: is a file, where vitlab writes"),
        (["notes/x.npz"], "notes: is a file, where vitlab writes the converted x.npz into a folder"),
        (["notes"], "notes: is a file, where vitlab writes"),
        (["box.npz"], "box.npz: is a folder, where vitlab writes a file of that name"),
    ]
    for dst, said in cases:
        assert main(["convert", str(tmp_path / "m"), str(tmp_path / dst[0]), *dst[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (dst, err)
    assert (tmp_path / "notes").read_text() == "mine" and not any((tmp_path / "box.npz").iterdir())
    with pytest.raises(OutputError, match="notes: is a file"):  # the library's writers too
        write_layout(vitlab.load(tmp_path / "m"), tmp_path / "notes" / "hf", layout="hf")


# timm name -> create_model arguments: every family of timm's layout written back, loaded strictly by timm
ROUND_TRIP = {
    "eva02_tiny_patch14_224": dict(depth=2, img_size=56),
    "eva02_base_patch14_224": dict(depth=1, img_size=56, embed_dim=192, num_heads=3),
    "eva02_base_patch16_clip_224": dict(depth=1, img_size=64, embed_dim=192, num_heads=3),
    "vit_small_patch16_dinov3": dict(depth=1, img_size=32),
    "vit_small_plus_patch16_dinov3_qkvb": dict(depth=1, img_size=32),
    "vit_pe_core_tiny_patch16_384": dict(depth=1, img_size=64),
    "vit_medium_patch16_rope_reg1_gap_256": dict(depth=1, img_size=64, embed_dim=192, num_heads=3),
    "vit_small_patch14_reg4_dinov2": dict(depth=1, img_size=56),
    "vit_base_patch16_siglip_224": dict(depth=1, img_size=32),
    "vit_tiny_patch16_224": dict(depth=1, img_size=32),
    "vit_small_patch16_rope_224": dict(depth=1, img_size=32),
}


@pytest.mark.parametrize(
    "name",
    slow_cases(ROUND_TRIP, {"vit_pe_core_tiny_patch16_384", "vit_base_patch16_siglip_224"}),  # seconds each
)
def test_timm_layout_round_trip_loads_strictly_in_timm(name, tmp_path):
    kw = ROUND_TRIP[name]
    ref = randomize(timm.create_model(name, pretrained=False, num_classes=5, **kw))
    heads = {"num_heads": kw["num_heads"]} if "num_heads" in kw else {}
    model = vitlab.load(dict(ref.state_dict()), img_size=kw["img_size"], **heads)  # (invisible without a table)
    out, _ = write_layout(model, tmp_path / "w", layout="timm")
    again = timm.create_model(name, pretrained=False, num_classes=5, **kw).eval()
    again.load_state_dict(safetensors_torch.load_file(str(out / "model.safetensors")), strict=True)
    built = timm.create_model(f"local-dir:{out}", pretrained=True).eval()  # from timm's config.json written too
    x = images(kw["img_size"], kw["img_size"])
    with torch.no_grad():
        assert_close_rel(again(x), ref(x))
        assert_close_rel(built(x), ref(x))


def test_hf_layout_of_the_papers_vit(tmp_path):
    """The paper's ViT goes to Hugging Face's ViTForImageClassification (ViTModel with its pooler for the mlp
    head), which from_pretrained loads with nothing missing and timm's logits; vitlab reads it back."""
    torch.manual_seed(0)
    ref = randomize(timm.create_model("vit_tiny_patch16_224", depth=2, img_size=32, num_classes=4))
    model = vitlab.load(dict(ref.state_dict()))
    write_layout(model, tmp_path / "cls", layout="hf")
    hf, info = transformers.ViTForImageClassification.from_pretrained(tmp_path / "cls", output_loading_info=True)
    assert not any(info.values())  # no missing, unexpected or mismatched key
    pooled = vitlab.create_model("vit_ti16", depth=1, img_size=32, head="mlp", num_classes=0)
    write_layout(randomize(pooled), tmp_path / "pool", layout="hf")
    model_hf = transformers.ViTModel.from_pretrained(tmp_path / "pool").eval()
    x = images()
    with torch.no_grad():
        assert_close_rel(hf.eval()(pixel_values=x).logits, ref(x))
        assert_close_rel(vitlab.load(tmp_path / "cls")(x), ref(x))
        assert_close_rel(model_hf(pixel_values=x).pooler_output, pooled(x))
    with pytest.raises(CheckpointError, match="init_values"):  # DINOv2's layer scale: no place in ViTModel
        write_layout(vitlab.create_model("vit_small_patch14_dinov2", depth=1), tmp_path / "d2", layout="hf")


@pytest.mark.parametrize("posemb", ["sincos2d", "learn2d"])
def test_auto_recipe_models_go_to_timm_and_hugging_face(posemb, tmp_path, capsys):
    """Every auto recipe picks the fixed sine-cosine table (and the 2-D variant learns rows and columns): timm's and
    Hugging Face's classes have no place for either, so the table they equal at the model's size is written as the
    learned E_pos, zero for the class token. Both libraries then give vitlab's logits; timm's architecture is one timm
    registers (its Ti/16 with patch 8: timm has no Ti/8)."""
    shape = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128)  # a small Ti/8
    model = randomize(vitlab.create_model("vit_ti16", **shape, num_classes=3, posemb=posemb))
    vitlab.save(model, tmp_path / "m", extra={"temperature": 0.8})  # as a run calibrates its model
    for layout in ("timm", "hf"):
        assert main(["convert", str(tmp_path / "m"), str(tmp_path / layout), "--layout", layout]) == 0
        err = capsys.readouterr().err
        assert f"posemb '{posemb}': written as the learned table it equals at 32x32 px" in err
        assert "temperature 0.8 (the run's calibration" in err and "softmax(logits / 0.8) gives the calibrated" in err
    timm_model = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    hf_model = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = images()
    with torch.no_grad():
        want = model(x)
        assert_close_rel(timm_model(x), want)
        assert_close_rel(hf_model(pixel_values=x).logits, want)
        assert_close_rel(vitlab.load(tmp_path / "hf")(x), want)  # back, as a learned table
    assert json.loads((tmp_path / "timm" / "config.json").read_text())["model_args"]["patch_size"] == 8


@pytest.mark.slow  # (10 s: every timm name built on the meta device)
def test_timm_layout_names_only_architectures_timm_registers():
    """vitlab takes every size x patch x resolution in timm's naming pattern as its own name; the layout writes only
    those timm builds, so ``timm.create_model("local-dir:...")`` never meets an unknown model; and it knows which of
    them keep no position rows for the prefix tokens (timm's ``no_embed_class``)."""
    from vitlab.models.variants import BACKBONES, NO_EMBED_CLASS, NOT_IN_TIMM, TIMM_ALIASES

    registered = set(timm.list_models())
    assert set(TIMM_ALIASES) >= NOT_IN_TIMM
    written = [n for n in (*BACKBONES, *TIMM_ALIASES) if n not in NOT_IN_TIMM]
    assert [n for n in written if n not in registered] == []
    with torch.device("meta"):
        assert {n for n in written if getattr(timm.create_model(n), "no_embed_class", False)} == NO_EMBED_CLASS


@pytest.mark.parametrize("source", ["timm", "hf"])
def test_dinov2_with_registers_to_timm_adds_the_prefix_rows_to_the_tokens(source, tmp_path):
    """timm's DINOv2 with registers keeps no position rows for the class and register tokens (no_embed_class). A
    model whose class token has one (Hugging Face's DINOv2 adds it; a fine-tune trains it) was refused ("not zero
    (trained here)"), or, loaded from Hugging Face, written with the rows and read by timm's filter as another table:
    outputs 1.39 apart. A prefix token's row is a constant added to a constant token: it is added to the token."""
    if source == "timm":
        ref = randomize(timm.create_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=28))
        model = vitlab.load(dict(ref.state_dict()))
        with torch.no_grad():
            model.pos_embed[:, :1] += 1.0  # the class token's row, trained
    else:
        kw = {"image_size": 28, "patch_size": 14, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
        cfg = transformers.Dinov2WithRegistersConfig(**kw, mlp_ratio=2, num_register_tokens=4)
        randomize(transformers.Dinov2WithRegistersModel(cfg)).save_pretrained(tmp_path / "hf")
        model = vitlab.load(tmp_path / "hf")
    out, _ = write_layout(model, tmp_path / "timm", layout="timm")
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "vit_small_patch14_reg4_dinov2"
    again = timm.create_model(config["architecture"], pretrained=False, **config["model_args"]).eval()
    again.load_state_dict(safetensors_torch.load_file(str(out / "model.safetensors")), strict=True)
    x = images(28, 28)
    with torch.no_grad():
        assert_close_rel(again(x), model(x))
        assert_close_rel(vitlab.load(out)(x), model(x))


def test_hugging_faces_processor_gives_vitlabs_evaluation_pixels(tmp_path):
    """The written preprocessor_config.json resizes the shorter side (bicubic) to the side over crop_pct and takes
    the centre, as vitlab evaluates: a portrait photo of the model's data gives Hugging Face's pipeline the pixels
    `vitlab predict` feeds the model (ViT's own processor squashes the whole photo, bilinear). crop_pct reads back
    so that the resize is to the same side (64 / (64 / 73) is 72.99... in floats)."""
    from PIL import Image

    from vitlab.data.images.resize import resize_side
    from vitlab.evaluate.accuracy import transforms_for

    model = vitlab.create_model("vit_ti16", img_size=64, depth=1, num_classes=2, crop_pct=0.875)
    write_layout(model, tmp_path / "hf", layout="hf")
    proc = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    yy, xx = np.mgrid[0:130, 0:97]
    photo = np.stack([xx * 2, yy * 2, (xx + yy) % 256], axis=-1).astype(np.uint8)  # smooth: resizes agree closely
    image = Image.fromarray(photo)
    theirs = proc(image, return_tensors="pt")["pixel_values"][0]
    ours = transforms_for(model)(image)
    assert theirs.shape == ours.shape == (3, 64, 64)
    assert (theirs - ours).abs().mean() < 0.02 * ours.abs().mean()
    back = vitlab.load(tmp_path / "hf").config.crop_pct
    assert back == pytest.approx(64 / 73) and resize_side(64, back) == 73


@pytest.mark.slow
def test_the_layout_agreement_benchmark_scores_three_libraries(monkeypatch, capsys):
    """``benchmarks/layout_agreement.py --smoke``: its rows (never its numbers)."""
    from benchscripts import load

    bench = load("layout_agreement")
    monkeypatch.setattr("sys.argv", ["layout_agreement.py", "--smoke"])
    bench.main()
    out = capsys.readouterr().out
    assert "6 photos" in out and "processor CLIPImageProcessor" in out
    assert re.search(r"\| timm \| [\d.]+% \| 100\.0% \|", out) and "| hf |" in out  # timm: the same pixels


def test_a_padded_model_goes_to_timm_and_is_refused_by_hugging_face(tmp_path):
    """The auto recipe pads sides its patch does not divide (a folder of 50x40 pictures: height 40 x width 50, patch
    4, a 10 x 13 grid). timm's name matched no architecture (only the weights were written), and Hugging Face's
    folder was written though its ViTModel, which floors the grid, could not load it. Now timm builds it at the
    padded size with dynamic_img_pad (its table is img_size // patch) and takes the 40 x 50 input; Hugging Face's
    layout refuses the padding by name."""
    shape = dict(img_size=(40, 50), patch_size=4, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    model = randomize(vitlab.create_model("vit_ti16", **shape, num_classes=2, dynamic_img_pad=True))
    out, _ = write_layout(model, tmp_path / "timm", layout="timm")
    config = json.loads((out / "config.json").read_text())
    assert config["model_args"]["img_size"] == [40, 52] and config["pretrained_cfg"]["input_size"] == [3, 40, 50]
    built = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    x = images(40, 50)
    with torch.no_grad():
        assert_close_rel(built(x), model(x))
    with pytest.raises(CheckpointError, match="^dynamic_img_pad True: has no place in Hugging Face's ViTModel"):
        write_layout(model, tmp_path / "hf", layout="hf")


def test_registers_on_any_timm_name(tmp_path):
    """Registers (Darcet et al. 2024) are a keyword argument of timm's VisionTransformer: a class-token ViT with 4 of
    them matched no timm name with registers (only the weights were written); now it is timm's Ti/16 with
    ``reg_tokens=4`` and its table's register rows, loaded strictly, with vitlab's logits."""
    shape = dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, mlp_dim=128)
    model = randomize(vitlab.create_model("vit_ti16", **shape, num_classes=3, reg_tokens=4))
    out, notes = write_layout(model, tmp_path / "timm", layout="timm")
    assert json.loads((out / "config.json").read_text())["model_args"]["reg_tokens"] == 4, notes
    built = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    x = images()
    with torch.no_grad():
        assert_close_rel(built(x), model(x))


def test_hugging_faces_distilled_deit_both_ways(tmp_path):
    """The distilled DeiT checkpoints on the Hub (``facebook/deit-*-distilled-*``) are Hugging Face's
    DeiTForImageClassificationWithTeacher (``model_type: deit``): "not a ViT checkpoint" before. They load as vitlab's
    DeiT (a distillation token, two heads averaged, as timm's) with Hugging Face's logits, and a vitlab DeiT is written
    back as that class. DeiTForImageClassification, whose distillation token no head reads, is refused by name."""
    cfg = transformers.DeiTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        num_labels=3,
    )  # fmt: skip
    ref = randomize(transformers.DeiTForImageClassificationWithTeacher(cfg))
    ref.save_pretrained(tmp_path / "hub")
    model = vitlab.load(tmp_path / "hub")
    assert model.config.dist_token and model.config.norm_eps == 1e-12
    x = images()
    with torch.no_grad():
        want = ref(pixel_values=x).logits
        assert_close_rel(model(x), want)
    write_layout(model, tmp_path / "back", layout="hf")
    again, info = transformers.AutoModelForImageClassification.from_pretrained(
        tmp_path / "back", output_loading_info=True
    )
    assert type(again).__name__ == "DeiTForImageClassificationWithTeacher" and not any(info.values())
    with torch.no_grad():
        assert_close_rel(again.eval()(pixel_values=x).logits, want)
    randomize(transformers.DeiTForImageClassification(cfg)).save_pretrained(tmp_path / "plain")
    with pytest.raises(CheckpointError, match="DeiT folder without the distillation head"):
        vitlab.load(tmp_path / "plain")


def test_sequence_pooling_is_refused_by_the_timm_layout(tmp_path):
    """CCT's sequence pooling (``--pool seq``, the speedrun's option) has no timm pooling. Its timm layout was written
    with "timm.create_model('local-dir:...', pretrained=True) builds vit_base_patch16_siglip_224", which timm then
    refused ("Only avg, avgmax, max, token, map or prr pooling (or none) is supported"); now it is refused by name,
    before anything is written."""
    model = vitlab.create_model("vit_ti16", depth=1, num_classes=3, pool="seq", class_token=False)
    with pytest.raises(CheckpointError, match="^pool 'seq': has no place in timm's VisionTransformer"):
        write_layout(model, tmp_path / "timm", layout="timm")
    assert not (tmp_path / "timm").exists()


@pytest.mark.parametrize(
    "structure",
    [
        dict(head="mlp", representation_size=16),  # the paper's pre-training head: timm has no pre-logits layer
        dict(stem="conv", stem_layers=2, stem_width=16, patch_size=1),  # CCT's convolutional tokenizer
        dict(attention="axial"),  # the paper's axial-attention variant
        dict(hybrid_layers=(1,), patch_size=1, img_size=64),  # a ResNet stem of one stage: no timm name has it
    ],
    ids=["pre-logits", "conv-stem", "axial", "hybrid"],
)
def test_a_structure_no_timm_name_has_is_written_as_weights_only(tmp_path, structure):
    """The timm layout named the nearest timm architecture with the same options without comparing the stem, the
    attention or the head, so these were written as "builds vit_tiny_patch16_224", which timm then failed to load
    (missing, unexpected or mis-shaped keys). Now no name matches them, and the note says only the weights are
    written."""
    shape = dict(depth=1, num_classes=3, img_size=32, patch_size=8, embed_dim=32, num_heads=2, mlp_dim=64)
    model = vitlab.create_model("vit_ti16", **{**shape, **structure})
    out, notes = write_layout(model, tmp_path / "timm", layout="timm")
    assert "timm: no timm architecture name has these options; only the weights are written" in notes
    assert not (out / "config.json").exists() and (out / "model.safetensors").is_file()


def test_a_rectangular_model_comes_back_from_the_hugging_face_layout(tmp_path):
    """A model of a rectangular grid (4 x 5 patches) was written in Hugging Face's layout (its ``image_size`` a
    pair, which ``ViTForImageClassification`` loads) but not read back: the size was inferred from the table as a
    square before the stated one was read ("20 position embeddings do not form a square grid; pass
    img_size=(height, width)"), and passing it did not help either. Now the stated or given size's grid is taken."""
    shape = dict(img_size=(32, 40), patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    model = randomize(vitlab.create_model("vit_ti16", **shape, num_classes=3))
    out, _ = write_layout(model, tmp_path / "hf", layout="hf")
    x = images(32, 40)
    with torch.no_grad():
        assert_close_rel(vitlab.load(out)(x), model(x))
        assert_close_rel(transformers.ViTForImageClassification.from_pretrained(out).eval()(x).logits, model(x))
    torch.save(model.state_dict(), tmp_path / "weights.pth")  # a bare state dict: the size given
    with torch.no_grad():
        assert_close_rel(vitlab.load(tmp_path / "weights.pth", img_size=(32, 40), num_heads=2)(x), model(x))
