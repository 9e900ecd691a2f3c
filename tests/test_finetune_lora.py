"""``vitlab finetune --lora R`` / ``--tune ssf|bias`` end to end (issue 60): the run says how many parameters train;
``model/`` is a plain ViT (no adapter keys) whose ``vitlab eval`` equals the run's top-1, with LoRA's updates merged
as ``W + (alpha / r) B A``; ``--keep-adapters`` writes the adapters alone in ``peft``'s files; ``last.pt`` holds the
adapters, and a run stopped with ``--stop-after`` and resumed ends as the run that never stopped, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import vitlab
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train.persist.state import load_state

pytestmark = pytest.mark.slow  # end to end: every test here trains and fine-tunes runs

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--no-progress", "--batch-size", "8", "--recipe", "digits"]
FT = ["--epochs", "2", "--batch-size", "8", "--seed", "3", "--threads", "1", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny pre-trained model (one epoch on 8 px colour images) and the data to fine-tune it on."""
    root = tmp_path_factory.mktemp("lora")
    data = tiny_folder(root / "data", per_class=8, test_per_class=2)
    cache = ["--cache-dir", str(root / "cache")]
    assert main(["train", "--data", str(data), *cache, *TINY, "--epochs", "1", "--out", str(root / "src")]) == 0
    return {"init": root / "src" / "model", "args": ["--data", str(data), *cache], "data": data}


def finetune(source, out, *extra: str) -> int:
    return main(["finetune", "--init", str(source["init"]), *source["args"], *FT, "--out", str(out), *extra])


def eval_top1(source, model_dir) -> float:
    assert main(["eval", "--model", str(model_dir), *source["args"]]) == 0
    return json.loads((model_dir / "eval.json").read_text())["top1"]


def test_lora_run_states_what_trains_and_saves_a_plain_merged_model(source, tmp_path, capsys):
    out = tmp_path / "ft"
    assert finetune(source, out, "--lora", "4", "--lora-alpha", "8", "--keep-adapters", "--new-head") == 0
    text = capsys.readouterr().out
    # the 4 linears of its one block: r (in + out) each; the head, 16 x 3 + 3
    h = vitlab.load(source["init"]).config.mlp_dim
    adapters = 4 * ((16 + 48) + (16 + 16) + (16 + h) + (h + 16))
    assert f"LoRA r=4, alpha=8 on 4 linears (qkv,proj,fc1,fc2; merged into model/): {adapters + 51:,} of " in text
    assert "parameters train (" in text
    assert " model/ adapters/ last.pt" in text  # the results line names what --keep-adapters wrote
    with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not [k for k in keys if "lora" in k or "base_layer" in k]
    assert keys == set(vitlab.load(source["init"]).state_dict())
    saved = json.loads((out / "model" / "config.json").read_text())
    assert eval_top1(source, out / "model") == saved["extra"]["top1"]

    state = load_state(out / "last.pt")["model"]  # the training model: the wrapped one, adapters and frozen base
    qkv = "blocks.0.attn.qkv"
    a, b, w = (state[f"{qkv}.{k}.weight"] for k in ("lora_A", "lora_B", "base_layer"))
    assert torch.count_nonzero(b) > 0  # the adapters trained
    assert torch.equal(w, vitlab.load(source["init"]).state_dict()[f"{qkv}.weight"])  # the base stayed frozen
    merged = vitlab.load(out / "model").state_dict()[f"{qkv}.weight"]
    torch.testing.assert_close(merged, w + (8 / 4) * b @ a, rtol=1e-5, atol=1e-6)

    with safe_open(str(out / "adapters" / "adapter_model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor(f"base_model.model.{qkv}.lora_A.weight"), a)
    cfg = json.loads((out / "adapters" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["base_model_name_or_path"]) == (4, 8.0, str(source["init"]))

    # --overwrite removes what the run wrote there, the adapters included
    assert finetune(source, out, "--tune", "bias", "--overwrite") == 0
    assert not (out / "adapters").exists()


@pytest.mark.parametrize("method", ["ssf", "bias"])
def test_ssf_and_bias_runs_save_a_plain_model_that_evaluates_as_the_run(source, tmp_path, capsys, method):
    out = tmp_path / method
    assert finetune(source, out, "--tune", method) == 0
    assert "parameters train (" in capsys.readouterr().out
    with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(vitlab.load(source["init"]).state_dict())
    saved = json.loads((out / "model" / "config.json").read_text())
    assert eval_top1(source, out / "model") == saved["extra"]["top1"]


def outcome(out) -> tuple[list[dict], dict[str, torch.Tensor]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keys = ("epoch", "step", "train_loss", "lr", "top1", "eval_loss")
    return [{k: r[k] for k in keys} for r in rows], load_state(out / "last.pt")["model"]


def test_a_lora_run_stopped_and_resumed_is_the_uninterrupted_run(source, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert finetune(source, full, "--lora", "2") == 0
    assert finetune(source, part, "--lora", "2", "--stop-after", "4") == 0  # mid-way through the second epoch
    assert json.loads((part / "summary.json").read_text())["steps"] == 4
    assert finetune(source, part, "--lora", "2", "--resume") == 0
    (rows_a, w_a), (rows_b, w_b) = outcome(full), outcome(part)
    assert rows_a == rows_b
    assert w_a.keys() == w_b.keys() and any(".lora_A." in k for k in w_a)
    for k, v in w_a.items():
        assert torch.equal(w_b[k], v), k
