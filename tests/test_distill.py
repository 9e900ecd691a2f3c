"""Distillation training (DeiT, Touvron et al. 2021): the hard and soft losses as documented (against a
hand computation), the distillation token's head taking the teacher's target, a run with a frozen
teacher, and the teacher refused in one line when it does not fit the data."""

from __future__ import annotations

import json
import math

import pytest
import torch

import vitlab
from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train.engine import run as setup_mod
from vitlab.train.objectives.distill import distillation_loss

S = [[2.0, -1.0, 0.5], [0.1, 0.3, -0.4]]  # student logits, 2 images x 3 classes
T = [[0.2, 1.5, -1.0], [3.0, 0.0, 1.0]]  # teacher logits: argmax 1 and 0
Y = [0, 2]


def _log_softmax(row, tau=1.0):
    z = [v / tau for v in row]
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return [v - lse for v in z]


def _ce(row, k):
    return -_log_softmax(row)[k]


def test_hard_loss_by_hand():
    want = sum((_ce(s, y) + _ce(s, max(range(3), key=t.__getitem__))) / 2 for s, t, y in zip(S, T, Y)) / 2
    got = distillation_loss(torch.tensor(S), torch.tensor(T), torch.tensor(Y), kind="hard")
    assert_close_rel(got, torch.tensor(want))


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_soft_loss_by_hand(tau):
    kl = 0.0
    for s, t in zip(S, T):
        ls, lt = _log_softmax(s, tau), _log_softmax(t, tau)
        kl += sum(math.exp(b) * (b - a) for a, b in zip(ls, lt))
    kl = kl / len(S) * tau * tau  # per-image mean x tau^2
    ce = sum(_ce(s, y) for s, y in zip(S, Y)) / len(S)
    got = distillation_loss(torch.tensor(S), torch.tensor(T), torch.tensor(Y), kind="soft", tau=tau)
    assert_close_rel(got, torch.tensor((ce + kl) / 2))


def test_with_a_distillation_token_the_heads_split_the_terms():
    cls = torch.tensor(S, requires_grad=True)
    dist = torch.tensor(S[::-1], requires_grad=True)
    loss = distillation_loss((cls, dist), torch.tensor(T), torch.tensor(Y), kind="hard")
    loss.backward()
    # the class head sees the labels only, the distillation head the teacher's argmax only
    c2 = torch.tensor(S, requires_grad=True)
    (torch.nn.functional.cross_entropy(c2, torch.tensor(Y)) / 2).backward()
    d2 = torch.tensor(S[::-1], requires_grad=True)
    (torch.nn.functional.cross_entropy(d2, torch.tensor(T).argmax(1)) / 2).backward()
    assert_close_rel(cls.grad, c2.grad)
    assert_close_rel(dist.grad, d2.grad)


def _teacher(path, *, classes=("class0", "class1", "class2"), img=8):
    torch.manual_seed(0)
    cfg = ViTConfig(
        name="vit_teacher",
        img_size=img,
        patch_size=4,
        embed_dim=16,
        depth=1,
        num_heads=2,
        mlp_dim=32,
        num_classes=len(classes),
        class_names=list(classes),
    )
    m = VisionTransformer(cfg)
    torch.nn.init.normal_(m.head.weight, std=0.5)  # a non-zero head: the targets are not all uniform
    vitlab.save(m, path)
    return path


TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4", "--no-progress", "--recipe", "digits"]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "token"), [("hard", True), ("soft", False)])
def test_one_epoch_with_a_frozen_teacher(tmp_path, capsys, monkeypatch, kind, token):
    data = tiny_folder(tmp_path / "data", per_class=8, test_per_class=2)
    teacher = _teacher(tmp_path / "teacher", img=12)  # another input size: the batch is resized for it
    seen = {}
    real = setup_mod.build_objective

    def spy(*a, **k):
        d = real(*a, **k)
        seen["d"] = d
        seen["before"] = {n: p.detach().clone() for n, p in d.teacher.state_dict().items()}
        calls = seen.setdefault("calls", [])
        logits = d.teacher_logits

        def counted(x):
            calls.append(x.shape)
            return logits(x)

        d.teacher_logits = counted
        return d

    monkeypatch.setattr(setup_mod, "build_objective", spy)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), *TINY, "--epochs", "1"]
    args += ["--batch-size", "8", "--teacher", str(teacher), "--distill", kind, "--out", str(out)]
    assert main(args + (["--distill-token", "--pool", "cls"] if token else [])) == 0
    printed = capsys.readouterr().out
    assert f"distillation ({kind}" in printed and str(teacher) in printed
    assert ("student's distillation-token head" if token else "student's class head") in printed
    d = seen["d"]
    assert len(seen["calls"]) == json.loads((out / "summary.json").read_text())["steps"] == 3  # 24 images / 8
    for n, p in d.teacher.state_dict().items():
        assert torch.equal(p, seen["before"][n]), n  # frozen: not a bit changed
    assert not d.teacher.training and not any(p.requires_grad for p in d.teacher.parameters())
    m = vitlab.load(out / "model")
    assert m.config.dist_token is token and m(torch.zeros(1, 3, 8, 8)).shape == (1, 3)
    if token:  # the distillation head (zero-initialised) was trained on the teacher's target
        assert m.head_dist.weight.abs().sum() > 0


def test_a_teacher_with_other_classes_is_refused_in_one_line(tmp_path, capsys):
    data = tiny_folder(tmp_path / "data", per_class=2, test_per_class=1)
    teacher = _teacher(tmp_path / "teacher", classes=("cat", "dog"))
    common = ["train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), *TINY, "--epochs", "1"]
    assert main([*common, "--teacher", str(teacher), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab train: error: --teacher") and err.count("\n") == 1
    assert "2 classes (cat, dog), the data has 3 (class0, class1, class2)" in err
    named = _teacher(tmp_path / "named", classes=("class2", "class1", "class0"))  # same number, other order
    assert main([*common, "--teacher", str(named), "--out", str(tmp_path / "run2")]) == 2
    assert "same classes, in the same order" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--distill", "soft"], "need a teacher"),
        (["--distill-token"], "need a teacher"),
        (["--teacher", "vit_ti16"], "untrained architecture"),
        (["--teacher", "x", "--distill-tau", "0"], "--distill-tau 0: must be positive"),
    ],
)
def test_distillation_options_refused_before_training(tmp_path, capsys, extra, says):
    data = tiny_folder(tmp_path / "data", per_class=2, test_per_class=1)
    args = ["train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), *TINY, "--out", str(tmp_path / "r")]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
