"""``vitlab train --grad-checkpointing``: the flag reaches the model, and training with it gives the
same losses and weights as without (activation checkpointing recomputes, it does not approximate)."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab.models.vit as vit_module
from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab.train import TrainConfig, fit, get_recipe
from vitlab.train.persist.state import load_state


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("data") / "rgb")


def config(data_dir, out, **kw):
    recipe = get_recipe("small-data", epochs=1, batch_size=16, warmup_epochs=1, drop_path=0.1, lr=3e-3)
    return TrainConfig(
        recipe=recipe,
        data=str(data_dir),
        out=str(out),
        arch={"patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2},
        cache_dir=str(out.parent / "cache"),
        workers=0,
        progress=False,
        **kw,
    )


def losses(out):
    return [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_grad_checkpointing_trains_to_the_same_weights(data_dir, tmp_path, monkeypatch):
    calls = []
    real = vit_module.checkpoint

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(vit_module, "checkpoint", counting)
    plain = fit(config(data_dir, tmp_path / "plain"))
    assert not calls  # off by default
    ckpt = fit(config(data_dir, tmp_path / "ckpt", grad_checkpointing=True))
    assert len(calls) >= 2 * ckpt["steps"]  # every block of every step went through checkpoint()
    assert plain["steps"] == ckpt["steps"] > 0
    for a, b in zip(losses(tmp_path / "plain"), losses(tmp_path / "ckpt"), strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    wa = load_state(tmp_path / "plain" / "last.pt")["model"]
    wb = load_state(tmp_path / "ckpt" / "last.pt")["model"]
    # all weights as one vector: near-zero biases differ by float32 rounding (the plain and the fused CPU
    # block sum in other orders), which is tiny against the weights' scale
    flat = [torch.cat([w[k].flatten().double() for k in sorted(wa)]) for w in (wa, wb)]
    assert_close_rel(flat[1], flat[0], rtol=1e-5)


def test_checkpointed_gradients_match_on_the_fast_model() -> None:
    """The model ``vitlab train`` builds (:mod:`vitlab.accel`'s class), with stochastic depth: same loss
    and gradients with and without checkpointing (the RNG state is replayed in the recomputation)."""
    from vitlab import create_model

    torch.manual_seed(0)
    m = create_model("vit_ti16", num_classes=5, img_size=32, patch_size=8, drop_path_rate=0.1).train()
    x = torch.randn(4, 3, 32, 32)
    grads = []
    for on in (False, True):
        m.set_grad_checkpointing(on)
        m.zero_grad()
        torch.manual_seed(1)
        loss = m(x).logsumexp(-1).mean()
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert_close_rel(grads[1][0], grads[0][0])
    for n, g in grads[0][1].items():
        assert_close_rel(grads[1][1][n], g, rtol=1e-5, msg=n)


def test_flag_is_parsed_and_honoured_on_resume() -> None:
    from vitlab.cli import build_parser
    from vitlab.train.conf.options import option
    from vitlab.train.conf.parser import config_from_args

    args = build_parser().parse_args(["train", "--grad-checkpointing"])
    assert config_from_args(args).grad_checkpointing is True
    assert config_from_args(build_parser().parse_args(["train"])).grad_checkpointing is False
    row = option("--grad-checkpointing")
    assert (row.resume, row.path) == ("honoured", "grad_checkpointing")  # a memory setting, not a different run
