"""``vitlab plan`` and :mod:`vitlab.train.sizing.capacity`: memory per device, step time, the paper's runs,
and the activation estimate checked against what autograd really saves."""

from __future__ import annotations

import pytest
import torch

from vitlab.cli import main
from vitlab.models import count_macs, create_model
from vitlab.train.sizing.capacity import activation_bytes, estimate, train_flops_per_image

B16_PARAMS = 86_567_656  # DESIGN.md, 224 px, 1000 classes


def _plan(**kw):
    args = dict(model="vit_b16", img_size=224, batch_size=256, devices=1, device_memory=80 * 2**30)
    return estimate(**{**args, **kw})


def test_b16_model_states_are_16_bytes_a_parameter() -> None:
    p = _plan()
    assert p.params == B16_PARAMS
    ddp = p.memory[0]
    assert ddp.strategy == "DDP"
    assert ddp.weights == B16_PARAMS * 4  # 346 MB of fp32 weights
    assert round(ddp.weights / 1e6) == 346
    assert ddp.gradients == B16_PARAMS * 4 and ddp.optimizer == B16_PARAMS * 8


def test_fsdp_divides_states_by_devices_and_ddp_does_not() -> None:
    one, eight = _plan(devices=1, batch_size=64), _plan(devices=8, batch_size=512)
    assert one.per_device_batch == eight.per_device_batch == 64
    assert eight.memory[0].weights == one.memory[0].weights  # DDP: every device holds everything
    assert eight.memory[0].activations == one.memory[0].activations  # same per-device batch
    assert eight.memory[1].optimizer == pytest.approx(B16_PARAMS * 8 / 8, rel=1e-6)
    # sharded states + the gathered blocks: well under DDP's, above the bare 1/K share
    assert B16_PARAMS * 4 / 8 < eight.memory[1].weights < one.memory[0].weights / 2


def test_checkpointing_reduces_activations_and_costs_a_forward() -> None:
    p = _plan()
    ddp, fsdp, ckpt = p.memory
    assert fsdp.activations == ddp.activations
    assert ckpt.activations < ddp.activations / 4
    assert p.step_seconds_checkpointing == pytest.approx(p.step_seconds * 4 / 3)


def test_step_time_from_flops_at_the_mfu() -> None:
    p = _plan(batch_size=4096, devices=8, mfu=0.5, peak_tflops=100.0)
    flops = 4096 * 6 * count_macs(create_model("vit_b16", num_classes=1000, img_size=224).config, 224)
    assert p.step_seconds == pytest.approx(flops / (8 * 100e12 * 0.5))
    assert train_flops_per_image(10) == 60 and train_flops_per_image(10, checkpointing=True) == 80


def test_paper_runs_reproduce_table_2_within_the_assumed_utilisation() -> None:
    """At a 100 % busy TPUv3 core the runs need fewer core-days than Table 2; the MFU this implies lies in
    a plausible band (0.2-0.6) for all three, i.e. the FLOP counts and the paper's figures agree."""
    p = _plan()
    for r in p.paper:
        assert r["core_days_at_100pct"] < r["paper_core_days"]
        assert 0.2 < r["implied_mfu"] < 0.6, r


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for backward, parameters excluded: torch's own
    account of activation memory."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() and s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(seen.values())


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_matches_autograd(checkpointing: bool) -> None:
    """ViT-Ti/16 at batch 8, 224 px, on CPU: the estimate is within 10 % of the bytes autograd saves.
    With checkpointing the estimate also counts one block recomputed in the backward pass, which the
    forward's saved tensors do not include, so that block is taken off before comparing."""
    torch.manual_seed(0)
    m = create_model("vit_ti16", num_classes=10).train()
    m.set_grad_checkpointing(checkpointing)
    measured = _saved_bytes(m, torch.randn(8, 3, 224, 224))
    est = activation_bytes(m.config, img_size=224, batch=8, checkpointing=checkpointing)
    if checkpointing:
        d, t = m.config.embed_dim, 197
        est -= 8 * t * (8 * d + 2 * m.config.mlp_dim + m.config.num_heads) * 4
    assert est == pytest.approx(measured, rel=0.10)


def test_plan_command_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "vit_b16", "--img-size", "224", "--batch-size", "512", "--devices", "8"]
    assert main([*argv, "--device-memory", "80G"]) == 0
    out = capsys.readouterr().out
    for word in ("DDP", "FSDP + ckpt", "86.6M params", "ImageNet-21k", "JFT-300M", "step:"):
        assert word in out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["plan", "--model", "vit_ti16", "--devices", "2", "--batch-size", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["memory"][0]["strategy"] == "DDP" and d["per_device_batch"] == 4


@pytest.mark.parametrize(
    "extra",
    [
        ["--model", "vit_nope"],
        ["--model", "vit_b16", "--device-memory", "lots"],
        ["--model", "vit_b16", "--mfu", "2"],
        ["--model", "vit_b16", "--devices", "0"],
    ],
)
def test_plan_bad_input_is_one_line(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab plan: error:")


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--peak-tflops", "nan"], "--peak-tflops"),
        (["--peak-tflops", "inf"], "--peak-tflops"),
        (["--peak-tflops", "-5"], "--peak-tflops"),
        (["--peak-tflops", "0"], "--peak-tflops"),
        (["--mfu", "nan"], "--mfu"),
        (["--mfu", "0"], "--mfu"),
        (["--mfu", "1.5"], "--mfu"),
        (["--img-size", "100000000"], "--img-size"),
        (["--img-size", "0"], "--img-size"),
        (["--batch-size", "100000000000000000000000"], "--batch-size"),
        (["--devices", "1000000000000"], "--devices"),
        (["--device-memory", "2000000T"], "--device-memory"),
        (["--accum-steps", "0"], "--accum-steps"),
        (["--batch-size", "4095"], "--batch-size"),  # not a multiple of 8 devices: train refuses it too
        (["--batch-size", "64", "--accum-steps", "3"], "--batch-size"),
    ],
)
def test_plan_numbers_are_validated_in_one_line_naming_the_flag(
    extra: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", "vit_b16", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab plan: error:") and flag in err[0], err
    assert "nan" not in err[0].split(flag, 1)[0]


@pytest.mark.slow
def test_plan_never_plans_a_batch_train_refuses() -> None:
    """``plan`` applies ``train``'s batch rule (:func:`vitlab.train.conf.rules.micro_batch`, the same function): for
    every batch, device count and accumulation, plan refuses exactly what train refuses, with train's message,
    and plans train's micro-batch."""
    from vitlab.errors import ConfigError
    from vitlab.train.conf.rules import micro_batch

    for batch in (6, 8, 12):
        for devices in (1, 2, 3):
            for accum in (1, 2):
                try:
                    want = micro_batch(batch, world_size=devices, accum_steps=accum)
                except ConfigError as e:
                    with pytest.raises(ConfigError) as got:
                        _plan(model="vit_ti16", batch_size=batch, devices=devices, accum_steps=accum)
                    assert str(got.value) == str(e)
                    continue
                p = _plan(model="vit_ti16", batch_size=batch, devices=devices, accum_steps=accum)
                assert p.per_device_batch == want and p.accum_steps == accum


def test_plan_reports_finite_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "vit_ti16", "--batch-size", "64", "--devices", "2", "--accum-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "inf " not in out.lower()
    assert "x 4 accumulation steps = 8 per device and step" in out


def test_plan_shows_the_split_train_makes_where_the_batch_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """Where DDP's step does not fit the device, ``plan`` names the split ``train``'s memory fit makes (the same
    :class:`~vitlab.train.sizing.capacity.BatchSplit`): the largest micro-batch dividing the per-device batch whose
    step fits in :data:`PLAN_MARGIN` of the device, with the accumulation that keeps the batch; None where one
    image does not fit."""
    from vitlab.train.sizing.capacity import PLAN_MARGIN

    roomy = _plan(model="vit_ti16", batch_size=48, devices=2)
    assert (roomy.fitted.micro, roomy.fitted.accum_steps) == (24, 1)  # the asked split fits 80 GiB
    need = {m: _plan(model="vit_ti16", batch_size=2 * m, devices=2).memory[0].total for m in (1, 2, 3, 4, 6, 8, 12)}
    room = int(need[6] / PLAN_MARGIN) + 1  # 6 images a device fit, 8 do not (12 and 24 neither)
    assert need[8] > PLAN_MARGIN * room
    tight = _plan(model="vit_ti16", batch_size=48, devices=2, device_memory=room)
    assert (tight.per_device_batch, tight.accum_steps) == (24, 1)  # what was asked, as asked
    assert (tight.fitted.micro, tight.fitted.accum_steps, tight.fitted.batch_size) == (6, 4, 48)
    assert _plan(model="vit_ti16", batch_size=48, devices=2, device_memory=int(need[1] / 2)).fitted is None
    assert main(["plan", "--model", "vit_ti16", "--batch-size", "48", "--devices", "2", "--device-memory",
                 str(room)]) == 0  # fmt: skip
    assert "splits it into 4 accumulation steps of 6 images a device" in capsys.readouterr().out
    assert main(["plan", "--model", "vit_ti16", "--batch-size", "48", "--device-memory", str(int(need[1] / 2))]) == 0
    assert "a step of 1 image a device does not fit" in capsys.readouterr().out
