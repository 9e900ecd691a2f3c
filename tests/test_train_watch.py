"""A training run watches its attention (issue 39): the health record of each epoch in metrics.jsonl and the
trackers, an alarm in the epoch line and the advice when it fires (and none on a tiny default run), watching
that leaves the training bit-identical, and --qk-norm / --reg-tokens reaching the model only when given."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from imagefolder import tiny_folder
from vitlab.cli import build_parser, main
from vitlab.inspect import RunContext
from vitlab.models import VisionTransformer
from vitlab.train.conf.arch import fresh_config
from vitlab.train.conf.parser import config_from_args
from vitlab.train.engine import watch
from vitlab.train.persist.health import LAYER_MEASURES


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("watch") / "data", per_class=16, size=16)


def _train(data, out, *extra, cache) -> list[str]:
    args = ["train", "--data", str(data), "--out", str(out), "--epochs", "2", "--cache-dir", str(cache)]
    assert main([*args, "--no-progress", "--workers", "0", *extra]) == 0
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_watched_run_records_health_logs_csv_raises_no_alarm_and_trains_as_an_unwatched_one(data, tmp_path, capsys):
    rows = _train(data, tmp_path / "on", "--watch-attention", "on", "--log", "csv", cache=tmp_path / "c")
    said = capsys.readouterr().out
    off = _train(data, tmp_path / "off", "--watch-attention", "off", cache=tmp_path / "c")
    # the health record of every epoch, one value per layer of the 4-block model
    for r in rows:
        assert all(len(r["attention"][k]) == 4 for k in LAYER_MEASURES)
        assert r["attention"]["images"] == 12 and r["attention"]["grid"] == [8, 8]
    assert all("attention" not in r for r in off)
    # measuring a copy on the plain path changes nothing in training: the same losses to the bit
    key = ("train_loss", "eval_loss", "top1")
    assert [[r[k] for k in key] for r in rows] == [[r[k] for k in key] for r in off]
    # a tiny default run raises no alarm
    assert "alarm:" not in said
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["attention"]["watch"] == "on" and summary["attention"]["passes"] == 2
    assert summary["attention"]["alarms"] == [] and summary["attention"]["notes"] == []
    assert (tmp_path / "on" / "health.png").is_file() and not (tmp_path / "off" / "health.png").exists()
    # --log csv: one row per epoch at its step, the per-layer health among the columns
    with (tmp_path / "on" / "scalars.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(t["step"]) for t in table] == [r["step"] for r in rows]
    assert float(table[-1]["train_loss"]) == pytest.approx(rows[-1]["train_loss"], rel=1e-12)
    assert float(table[-1]["attention/entropy/layer4"]) == rows[-1]["attention"]["entropy"][3]
    assert not (tmp_path / "off" / "scalars.csv").exists()


def _collapsed(vit):
    """The plain copy with each query and key weight scaled 30x: logits 900x, every row of attention one-hot."""
    copy = _plain_copy(vit)
    d = copy.config.embed_dim
    with torch.no_grad():
        for blk in copy.blocks:
            blk.attn.qkv.weight[: 2 * d] *= 30
    return copy


_plain_copy = watch.plain_copy


@pytest.mark.slow
def test_collapsed_attention_raises_its_alarm_in_the_epoch_line_once_and_in_the_advice(
    data, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(watch, "plain_copy", _collapsed)
    monkeypatch.setattr(watch, "named_notes", lambda history, context: [("no_local_heads", "what the run shows")])
    rows = _train(data, tmp_path / "run", "--watch-attention", "on", cache=tmp_path / "c")
    lines = capsys.readouterr().out.splitlines()
    assert all(f == 1.0 for f in rows[-1]["attention"]["collapsed_fraction"])
    alarms = [i for i, ln in enumerate(lines) if ln.startswith("alarm: attention entropy collapse")]
    assert len(alarms) == 1  # said when it first fires, not again each epoch
    assert lines[alarms[0] - 1].startswith("epoch 1/2") and "--qk-norm" in lines[alarms[0]]
    advice = [ln for ln in lines if ln.startswith("advice: attention entropy collapse in layers 1, 2, 3, 4")]
    assert len(advice) == 1 and "--qk-norm" in advice[0] and "a lower --lr" in advice[0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert advice[0] in summary["advice"].splitlines() and len(summary["attention"]["alarms"]) == 2
    # a note is said at the end only, after the advice, never as an alarm
    assert summary["attention"]["notes"] == ["what the run shows"]
    assert summary["advice"].splitlines()[-1] == "note: what the run shows" == lines[lines.index(advice[0]) + 2]
    assert not any("what the run shows" in ln for ln in lines if not ln.startswith("note: "))
    assert sum(ln.startswith("alarm: attention logit growth") for ln in lines) == 1  # 900x a fresh model's logits


def test_auto_stops_watching_past_its_share_of_the_time_and_says_so():
    ticks = iter([0.0, 10.0, 11.0])  # an epoch of 10 s, a pass of 1 s: 1/11 > 5%
    w = watch.AttentionWatch(mode="auto", images=torch.zeros(1, 3, 16, 16), context=RunContext(),
                             clock=lambda: next(ticks))  # fmt: skip
    w.epoch_began()
    torch.manual_seed(0)
    m = VisionTransformer(img_size=16, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    _, lines = w.measure(m, epoch=1, step=5)
    assert not w.due and w.summary()["stopped_after_epoch"] == 1
    assert lines == [
        "attention health: stopped after epoch 1: its passes took 9.1% of the epochs' time (--watch-attention "
        "auto allows 5%); --watch-attention on keeps it"
    ]


def test_qk_norm_and_registers_reach_the_model_only_when_given():
    p = build_parser()

    def model(*extra):
        cfg = config_from_args(p.parse_args(["train", "--data", "x", "--recipe", "digits", *extra]))
        c = fresh_config(cfg, image_size=16, in_chans=3, num_classes=3, class_names=["a", "b", "c"])
        return cfg, c

    cfg, plain = model()
    assert "qk_norm" not in cfg.arch and "reg_tokens" not in cfg.arch  # off: the model of before, field for field
    assert not plain.qk_norm and plain.reg_tokens == 0
    cfg, c = model("--qk-norm", "--reg-tokens", "4")
    assert c == plain.replace(qk_norm=True, reg_tokens=4)
    m = VisionTransformer(c)
    assert isinstance(m.blocks[0].attn.q_norm, torch.nn.LayerNorm) and m.reg_token.shape == (1, 4, c.embed_dim)


def test_a_missing_logger_library_is_refused_before_the_data(tmp_path, capsys, monkeypatch):
    import vitlab.track as track

    real = track.importlib.util.find_spec
    monkeypatch.setattr(track.importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a))
    missing = tmp_path / "no-such-data"
    argv = ["train", "--data", str(missing), "--out", str(tmp_path / "run"), "--log", "tensorboard"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vitlab train: error: --log tensorboard: the tensorboard package is not installed; "
        "pip install 'vitlab[tensorboard]'"
    ]


def test_the_measured_copy_is_plain_equal_and_separate_and_draws_no_random_number():
    from vitlab.accel.vit import FastVisionTransformer

    torch.manual_seed(0)
    fast = FastVisionTransformer(
        img_size=16, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3
    )
    state = torch.get_rng_state()
    copy = watch.plain_copy(fast)
    assert torch.equal(torch.get_rng_state(), state)
    assert type(copy) is VisionTransformer and not copy.training
    mine, theirs = copy.state_dict(), fast.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert all(mine[k].data_ptr() != theirs[k].data_ptr() for k in mine)
