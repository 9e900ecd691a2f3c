"""Hugging Face save_pretrained folders: logits match transformers (1e-5 of their size), config honoured."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from conftest import assert_close_rel

transformers = pytest.importorskip("transformers")

LABELS = ["airplane", "automobile", "bird", "cat", "deer"]


def hf_config(**kw):
    base = dict(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    return transformers.ViTConfig(**{**base, **kw})


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "layernorm" in name and name.endswith("weight") else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def pixels(n: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("act", "ours"), [("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_tanh")])
def test_image_classification_parity(tmp_path, act, ours):
    cfg = hf_config(
        num_labels=5, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)}, hidden_act=act
    )
    ref = randomize(transformers.ViTForImageClassification(cfg))
    ref.save_pretrained(tmp_path)
    model = vitlab.load(tmp_path)
    c = model.config
    assert (c.num_heads, c.norm_eps, c.act, c.num_classes, c.class_names) == (4, 1e-12, ours, 5, LABELS)
    x = pixels()
    with torch.no_grad():
        want = ref(pixel_values=x).logits
        got = model(x)
    assert want.abs().max() > 0.1
    assert_close_rel(got, want)


def test_vitmodel_pooler_is_the_mlp_head(tmp_path):
    """ViTModel's pooler (dense + tanh on the class token) = head='mlp' pre-logits, no classifier."""
    ref = randomize(transformers.ViTModel(hf_config(layer_norm_eps=1e-6)))
    ref.save_pretrained(tmp_path)
    model = vitlab.load(tmp_path)
    c = model.config
    assert (c.head, c.num_classes, c.norm_eps, c.class_names) == ("mlp", 0, 1e-6, None)
    x = pixels()
    with torch.no_grad():
        out = ref(pixel_values=x)
        assert_close_rel(model(x), out.pooler_output)
        assert_close_rel(model.forward_features(x), out.last_hidden_state)


def test_vitmodel_without_pooler_and_preprocessor_config(tmp_path):
    ref = randomize(transformers.ViTModel(hf_config(), add_pooling_layer=False))
    ref.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6]})
    )
    model = vitlab.load(tmp_path)
    assert (model.config.head, model.config.num_classes) == ("linear", 0)
    assert model.config.mean == (0.1, 0.2, 0.3) and model.config.std == (0.4, 0.5, 0.6)
    x = pixels()
    with torch.no_grad():
        assert_close_rel(model(x), ref(pixel_values=x).last_hidden_state[:, 0])


def test_bare_hf_weights_file_and_in_memory_names(tmp_path):
    """A bare HF model.safetensors (no config: HF's eps 1e-12 assumed) and transformers 5's in-memory
    names (layers.N.attention.q_proj, mlp.fc1) both convert."""
    ref = randomize(transformers.ViTForImageClassification(hf_config(num_labels=3)))
    ref.save_pretrained(tmp_path / "folder")
    x = pixels()
    with torch.no_grad():
        want = ref(pixel_values=x).logits
        for source in (tmp_path / "folder" / "model.safetensors", dict(ref.state_dict())):
            model = vitlab.load(source, num_heads=4)
            assert model.config.norm_eps == 1e-12
            assert_close_rel(model(x), want)


def test_hf_at_another_img_size(tmp_path):
    from timm.layers import resample_abs_pos_embed

    ref = randomize(transformers.ViTForImageClassification(hf_config(num_labels=3)))
    ref.save_pretrained(tmp_path)
    model = vitlab.load(tmp_path, img_size=64)
    pe = ref.vit.embeddings.position_embeddings.detach()
    want = resample_abs_pos_embed(pe, (8, 8), num_prefix_tokens=1, interpolation="bicubic", antialias=True)
    assert_close_rel(model.pos_embed.detach(), want, rtol=1e-6)


def test_unsupported_activation_is_a_clear_error(tmp_path):
    transformers.ViTModel(hf_config(hidden_act="relu")).save_pretrained(tmp_path)
    with pytest.raises(vitlab.CheckpointError, match="hidden_act 'relu'"):
        vitlab.load(tmp_path)


def test_an_mae_folder_is_its_encoder(tmp_path):
    """Hugging Face's MAE (``facebook/vit-mae-*``: ``model_type vit_mae``, "not a ViT checkpoint" before) is the
    paper's ViT with its fixed sine-cosine table stored and a decoder only pre-training uses: it loads as a backbone,
    the decoder left out, whose output is the encoder's class token after the final norm (MAE's last_hidden_state[:, 0],
    which its random masking does not move; a mask ratio of 0 keeps every patch)."""
    cfg = transformers.ViTMAEConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=32, mask_ratio=0.0,
    )  # fmt: skip
    ref = randomize(transformers.ViTMAEForPreTraining(cfg)).eval()
    ref.save_pretrained(tmp_path / "mae")
    model = vitlab.load(tmp_path / "mae")  # strict: every encoder tensor placed, nothing else left over
    assert model.config.num_classes == 0 and model.config.norm_eps == cfg.layer_norm_eps
    x = pixels()
    with torch.no_grad():
        assert_close_rel(model(x), ref.vit(pixel_values=x).last_hidden_state[:, 0])


@pytest.mark.parametrize("registers", [0, 4])
def test_a_dinov2_folder_loads_with_its_pooler_output(tmp_path, registers):
    """Hugging Face's DINOv2 (``facebook/dinov2-*``, with registers ``facebook/dinov2-with-registers-*``) was read as a
    bare state dict and refused with a list of unexpected tensors and a warning about its head count. Now it is the ViT
    with layer scale and registers (Hugging Face adds no position to a register: a zero row each) with its
    pooler_output; Dinov2ForImageClassification's classifier, which reads the class and mean patch tokens side by
    side, is refused by name."""
    kw = {"image_size": 28, "patch_size": 14, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    if registers:
        ref = transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**kw, mlp_ratio=2, num_register_tokens=registers)
        )
    else:
        ref = transformers.Dinov2Model(transformers.Dinov2Config(**kw, mlp_ratio=2))
    randomize(ref).eval().save_pretrained(tmp_path / "dinov2")
    model = vitlab.load(tmp_path / "dinov2")
    assert (model.config.reg_tokens, model.config.mlp_dim, model.config.extra["family"]) == (registers, 64, "DINOv2")
    x = pixels(size=28)
    with torch.no_grad():
        assert_close_rel(model(x), ref(pixel_values=x).pooler_output)
    if not registers:
        classifier = transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**kw, num_labels=3))
        classifier.save_pretrained(tmp_path / "classifier")
        with pytest.raises(vitlab.CheckpointError, match="Dinov2ForImageClassification: its classifier reads"):
            vitlab.load(tmp_path / "classifier")
