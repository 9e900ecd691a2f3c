"""Public checkpoint names: resolved to Hub repos, downloaded via a mocked hf_hub_download, never the network."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import save_file

import vitlab
import vitlab.accel
from vitlab.checkpoints import hub
from vitlab.cli import main

huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture
def timm_file(tmp_path):
    model = vitlab.VisionTransformer(
        img_size=32, patch_size=16, embed_dim=192, depth=1, num_heads=3, mlp_dim=384, num_classes=4
    )
    with torch.no_grad():
        model.head.weight.normal_()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors", model.eval()


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))


def test_table_has_the_public_checkpoints():
    assert hub.KNOWN["augreg_in21k_ft_in1k/vit_b16"] == hub.HubEntry(
        "timm/vit_base_patch16_224.augreg_in21k_ft_in1k", "timm"
    )
    assert hub.KNOWN["augreg2_in21k_ft_in1k/vit_b16"].repo_id == "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert hub.KNOWN["augreg_in21k_ft_in1k/vit_b16_384"].repo_id == "timm/vit_base_patch16_384.augreg_in21k_ft_in1k"
    assert hub.KNOWN["orig_in21k/vit_h14"].repo_id == "timm/vit_huge_patch14_224.orig_in21k"
    assert hub.KNOWN["google/vit_b16"] == hub.HubEntry("google/vit-base-patch16-224", "hf")
    assert hub.KNOWN["google_in21k/vit_l16"].repo_id == "google/vit-large-patch16-224-in21k"
    assert len(hub.list_names()) == 47


def test_timm_name_downloads_and_loads(monkeypatch, timm_file):
    path, ref = timm_file
    calls = []

    def fake_download(*, repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model = vitlab.load("augreg_in21k_ft_in1k/vit_b16")
    repo = "timm/vit_base_patch16_224.augreg_in21k_ft_in1k"
    assert calls == [(repo, "model.safetensors"), (repo, "config.json")]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), vitlab.accel.accelerate(ref)(x))


@pytest.mark.slow
def test_hf_name_downloads_config_and_weights(monkeypatch, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128
    )
    folder = tmp_path / "snapshot"
    transformers.ViTModel(cfg).eval().save_pretrained(folder)
    calls = []

    def fake_download(*, repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(folder / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model = vitlab.load("google_in21k/vit_b16")
    assert calls == [
        ("google/vit-base-patch16-224-in21k", "model.safetensors"),
        ("google/vit-base-patch16-224-in21k", "config.json"),
        ("google/vit-base-patch16-224-in21k", "preprocessor_config.json"),  # optional: none in this snapshot
    ]
    assert (model.config.head, model.config.num_heads, model.config.norm_eps) == ("mlp", 4, 1e-12)


@pytest.mark.slow
def test_any_hub_repo_by_timms_prefix_with_its_image_processor(monkeypatch, tmp_path):
    """``hf-hub:facebook/deit-base-distilled-patch16-224`` (timm's prefix for any Hub repo; the plain repo id names it
    in its refusal): its weights, config and image processor, whose ImageNet mean and std and 0.875 crop the model
    takes (without the processor it would have normalised by 0.5 and 0.5)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeiTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_labels=3,
    )  # fmt: skip
    folder = tmp_path / "snapshot"
    transformers.DeiTForImageClassificationWithTeacher(cfg).eval().save_pretrained(folder)
    imagenet = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}  # DeiT's
    processor = transformers.DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    pre = folder / "preprocessor_config.json"
    pre.write_text(json.dumps({**json.loads(pre.read_text()), **imagenet}))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *, repo_id, filename, **kw: str(folder / filename))
    repo = "facebook/deit-base-distilled-patch16-224"
    with pytest.raises(vitlab.CheckpointError, match=f"a Hugging Face Hub repo: hf-hub:{repo}"):
        vitlab.load(repo)
    model = vitlab.load(f"hf-hub:{repo}")
    assert model.config.dist_token and model.config.mean == pytest.approx((0.485, 0.456, 0.406))
    assert model.config.crop_pct == pytest.approx(32 / 36)


def test_falls_back_to_pytorch_model_bin(monkeypatch, tmp_path, timm_file):
    _, ref = timm_file
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")

    def fake_download(*, repo_id, filename, **kw):
        if filename == "model.safetensors":
            raise huggingface_hub.errors.EntryNotFoundError("404: model.safetensors")
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model = vitlab.load("timm/vit_base_patch16_224.augreg_in1k")
    assert torch.equal(model.head.weight, ref.head.weight)


def test_offline_error_says_what_to_download_and_where(monkeypatch, tmp_path, timm_file, capsys):
    def offline(*, repo_id, filename, **kw):
        raise huggingface_hub.errors.LocalEntryNotFoundError(
            "Cannot find the requested files in the disk cache and outgoing traffic has been disabled."
        )

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(vitlab.OfflineError) as e:
        vitlab.load("augreg_in21k/vit_s16")
    msg = str(e.value)
    assert "https://huggingface.co/timm/vit_small_patch16_224.augreg_in21k/resolve/main/model.safetensors" in msg
    local = tmp_path / "cache" / "hub" / "timm--vit_small_patch16_224.augreg_in21k"
    assert str(local) in msg and "\n" not in msg

    # the CLI prints it on one line and exits 2
    assert main(["convert", "augreg_in21k/vit_s16", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1

    # following the advice works without the network
    local.mkdir(parents=True)
    path, ref = timm_file
    (local / "model.safetensors").write_bytes(path.read_bytes())
    model = vitlab.load("augreg_in21k/vit_s16")
    assert torch.equal(model.head.weight, ref.head.weight)


def test_missing_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(vitlab.OfflineError, match=r"huggingface_hub is not installed.*vit-base-patch16-384"):
        vitlab.load("google/vit_b16_384")


def test_unknown_name_suggests_close_ones():
    with pytest.raises(vitlab.CheckpointError, match="did you mean augreg_in21k_ft_in1k/vit_b16"):
        vitlab.load("augreg_in21k_ft_in1k/vit_b61")


def test_unknown_name_points_to_the_command_that_lists_names():
    with pytest.raises(vitlab.CheckpointError) as e:
        vitlab.load("no_such_checkpoint_name")
    assert "vitlab models --pretrained" in str(e.value) and "list_names()" not in str(e.value)


def test_public_name_carries_its_hub_repo_licence_and_crop(monkeypatch, timm_file):
    """timm's pretrained_cfg keys for a public checkpoint: hf_hub_id, license and the publisher's crop_pct,
    which the config.json downloaded beside the weights may state instead."""
    import json

    path, _ = timm_file
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *, repo_id, filename, **kw: str(path))
    cfg = vitlab.load("augreg_in21k_ft_in1k/vit_b16").pretrained_cfg
    assert cfg["hf_hub_id"] == "timm/vit_base_patch16_224.augreg_in21k_ft_in1k"
    assert (cfg["license"], cfg["crop_pct"]) == ("apache-2.0", 0.9)
    assert vitlab.load("augreg_in21k_ft_in1k/vit_b16_384", img_size=32).pretrained_cfg["crop_pct"] == 1.0
    (path.parent / "config.json").write_text(
        json.dumps({"architecture": "vit_base_patch16_224", "pretrained_cfg": {"crop_pct": 0.95}})
    )
    assert vitlab.load("augreg_in21k_ft_in1k/vit_b16").config.crop_pct == 0.95
    any_repo = vitlab.load("timm/vit_base_patch16_224.some_tag").pretrained_cfg
    assert any_repo["hf_hub_id"] == "timm/vit_base_patch16_224.some_tag" and "license" not in any_repo


def test_offline_mode_takes_any_cached_alternative_and_says_why_none(monkeypatch, tmp_path, timm_file):
    """With HF_HUB_OFFLINE set, the Hub cache alone is read, every alternative tried (before: the first file missing
    from the cache ended the search, so a cached pytorch_model.bin was never found) and the refusal says why."""
    _, ref = timm_file
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    asked = []

    def cache_only(*, repo_id, filename, **kw):
        asked.append((filename, kw.get("local_files_only")))
        if filename == "pytorch_model.bin" and (tmp_path / filename).exists():
            return str(tmp_path / filename)
        raise huggingface_hub.errors.LocalEntryNotFoundError(f"{filename}: not in the disk cache")

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cache_only)
    model = vitlab.load("augreg_in21k/vit_s16")
    assert torch.equal(model.head.weight, ref.head.weight)
    assert asked[:2] == [("model.safetensors", True), ("pytorch_model.bin", True)]

    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(vitlab.OfflineError) as e:
        vitlab.load("augreg_in21k/vit_s16")
    assert "not in the Hub cache, and HF_HUB_OFFLINE allows no download" in str(e.value)
    assert "vit_small_patch16_224.augreg_in21k/resolve/main/model.safetensors" in str(e.value)


def test_a_public_name_not_downloaded_is_refused_for_that_not_as_an_unknown_name(monkeypatch):
    """The one model rule: a known public checkpoint that cannot be fetched says why (before: "not a registered
    name ...; did you mean axial_vit_s16, vit_s16?", the reason in parentheses after it)."""
    from vitlab.resolve import model_source, read_model

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    for option, get in (
        ("--model", lambda: vitlab.resolve_model("augreg_in21k/vit_s16")),
        ("--init", lambda: read_model(model_source("augreg_in21k/vit_s16", trained=True), option="--init")),
    ):
        with pytest.raises(vitlab.OfflineError) as e:
            get()
        text = str(e.value)
        assert text.startswith(f"{option} augreg_in21k/vit_s16: huggingface_hub is not installed"), text
        assert "did you mean" not in text and "not a registered name" not in text


def test_an_unknown_name_lists_close_registered_and_public_names_once():
    with pytest.raises(vitlab.UnknownModelError) as e:
        vitlab.resolve_model("vit_b166")
    text = str(e.value)
    assert text.count("did you mean") == 1 and "vit_b16" in text and "google/vit_b16" in text, text
    with pytest.raises(vitlab.UnknownModelError, match="`vitlab models` lists the names"):
        vitlab.resolve_model("zzz")
