"""The LoRA adapters alone, in Hugging Face ``peft``'s files: ``adapter_model.safetensors`` (each adapter as
``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``, the trained head as ``base_model.model.head.weight``,
as ``peft`` saves a ``modules_to_save`` module) and ``adapter_config.json`` (a ``LoraConfig``: ``r``,
``lora_alpha``, the exact module names in ``target_modules``, ``modules_to_save``). ``PeftModel.from_pretrained(base,
folder)`` loads them onto the ``--init`` model as timm builds it (same module names), with the same classes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from .._fs import default_file_mode, replacing
from . import HEADS
from .lora import LoRALinear

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "MARKER", "adapter_config", "adapter_state", "save_adapters"]

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
MARKER = {"format": "pt", "vitlab": "lora-adapters"}
"""The weights file's metadata: how ``--overwrite`` recognises the adapters vitlab wrote."""
PREFIX = "base_model.model."


def _lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of ``model`` and its trained heads, by ``peft``'s saved names (contiguous CPU copies)."""
    state: dict[str, torch.Tensor] = {}
    for n, m in _lora_layers(model).items():
        state[f"{PREFIX}{n}.lora_A.weight"] = m.lora_A.weight
        state[f"{PREFIX}{n}.lora_B.weight"] = m.lora_B.weight
    for h in HEADS:
        head = getattr(model, h, None)
        if head is not None:
            state.update({f"{PREFIX}{h}.{k}": v for k, v in head.state_dict().items()})
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def adapter_config(model: nn.Module, *, base: str | None) -> dict[str, Any]:
    """``adapter_config.json``: a ``peft`` ``LoraConfig`` of ``model``'s adapters (``base``: the model they
    adapt, ``base_model_name_or_path``)."""
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("the model holds no LoRA adapters")
    first = next(iter(layers.values()))
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base,
        "r": first.rank,
        "lora_alpha": first.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": list(layers),
        "modules_to_save": [h for h in HEADS if getattr(model, h, None) is not None],
        "init_lora_weights": True,
        "use_rslora": False,
        "inference_mode": True,
    }


def save_adapters(model: nn.Module, folder: str | os.PathLike[str], *, base: str | None) -> Path:
    """Write ``model``'s LoRA adapters (with its heads) into ``folder`` as ``peft`` does, each file through a
    temporary name renamed over its entry (a link there is replaced, never written through); the config last."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    config = adapter_config(model, base=base)
    with replacing(out / ADAPTER_CONFIG, what="the adapters' config") as tmp_c:
        with replacing(out / ADAPTER_WEIGHTS, what="the adapters") as tmp_w:
            save_file(adapter_state(model), str(tmp_w), metadata=MARKER)
            os.chmod(tmp_w, default_file_mode())
        tmp_c.write_text(json.dumps(config, indent=2) + "\n")
    return out
