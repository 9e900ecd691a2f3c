"""Running an exported folder the way a vitlab model runs: :func:`open_exported` gives an
:class:`ExportedModel`, an ``nn.Module`` with the model's ``config`` (preprocessing, class names) whose
``forward`` maps normalised ``pixel_values`` to logits, so ``vitlab predict`` and ``vitlab eval`` (and the
agreement report) feed it exactly as they feed the model it came from.

- ONNX (float or int8): an onnxruntime session on the CPU;
- ``torch`` (``model.safetensors``, float or int8): vitlab's eager model rebuilt from tensors only;
- TorchScript: only with ``trust_torchscript=True``: loading it runs the code stored in the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._fs import default_file_mode, replacing
from ..errors import CheckpointError, ConfigError
from ..export import ExportError, load_exported
from ..models.config import ViTConfig
from .folder import ExportInfo, read_export

__all__ = ["ExportedModel", "open_exported", "save_torch"]


class ExportedModel(nn.Module):
    """An exported model behind vitlab's model interface: ``config`` (a :class:`ViTConfig`: img_size,
    mean, std, class names ...), ``export`` (what was exported), ``forward(pixel_values) -> logits``.
    It always runs on the CPU: inputs on another device are copied over and the logits copied back."""

    def __init__(self, *, config: ViTConfig, export: ExportInfo, runner: Any, folder: Path) -> None:
        super().__init__()
        self.config = config
        self.export = export
        self.folder = folder
        self.runner = runner
        """An onnxruntime session, a ScriptModule, or a (possibly int8) VisionTransformer."""

    @property
    def tome_r(self) -> int:
        return self.export.tome_r

    def set_tome(self, r: int) -> ExportedModel:
        """Token merging is fixed in an exported graph: ``r`` must be the exported one."""
        if r != self.export.tome_r:
            raise ConfigError(
                f"--tome {r}: {self.folder} was exported with --tome {self.export.tome_r}; its graph is fixed "
                f"(export again with --tome {r})"
            )
        return self

    def to(self, *args: Any, **kwargs: Any) -> ExportedModel:
        """Stays on the CPU (see the class)."""
        return self

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = pixel_values.detach().to("cpu", torch.float32)
        if isinstance(self.runner, nn.Module):  # (a ScriptModule is one)
            with torch.inference_mode():
                out = self.runner(x).float()
        else:
            arr = np.ascontiguousarray(x.numpy())
            out = torch.from_numpy(self.runner.run(["logits"], {"pixel_values": arr})[0])
        return out.to(pixel_values.device)


def open_exported(
    folder: str | os.PathLike[str], *, trust_torchscript: bool = False, threads: int | None = None
) -> ExportedModel:
    """The exported model in ``folder`` (checked: :func:`.folder.read_export`), ready to run. TorchScript
    is refused unless ``trust_torchscript``. ``threads``: onnxruntime's intra-op threads (default: its own)."""
    p = Path(folder)
    cfg, info = read_export(p)
    path = p / info.file
    if info.format == "onnx":
        runner = _ort_session(path, threads)
    elif info.format == "torchscript":
        if not trust_torchscript:
            raise ConfigError(
                f"--model {p}: a TorchScript export runs the code stored in {info.file} when loaded; pass "
                "--trust-torchscript if you trust where it came from (or export --format onnx)"
            )
        runner = load_exported(path, format="torchscript")
    else:
        runner = _load_torch(path, cfg, info)
    return ExportedModel(config=cfg, export=info, runner=runner, folder=p).eval()


def _ort_session(path: Path, threads: int | None) -> Any:
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ExportError(f"{path}: running an ONNX export needs onnxruntime: pip install 'vitlab[onnx]'") from e
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own error types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: onnxruntime cannot load it ({first})") from None


def save_torch(model: nn.Module, path: Path, *, int8: bool) -> None:
    """``model`` (float, or made by :func:`.quantize.torch_dynamic` when ``int8``) as tensors in ``path``."""
    from safetensors.torch import save_file

    from .quantize import int8_state

    state = int8_state(model) if int8 else {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with replacing(path, what="the model") as tmp:  # (a link there is replaced, never written through)
        save_file(state, str(tmp), metadata={"format": "pt"})
        os.chmod(tmp, default_file_mode())  # safetensors creates it private (0600)


def _load_torch(path: Path, cfg: ViTConfig, info: ExportInfo) -> nn.Module:
    """vitlab's eager model from a ``torch`` export: built from the checked config (within the parameter cap
    :func:`vitlab.load` applies), the tensors loaded strictly, int8 layers rebuilt, token merging set."""
    from safetensors.torch import load_file

    from ..accel import accelerate
    from ..checkpoints import MAX_PARAMS, load_state
    from ..models.vit import VisionTransformer
    from .quantize import load_int8

    if cfg.num_params() > MAX_PARAMS:
        raise CheckpointError(f"{path.parent}: the config describes {cfg.num_params():,} parameters (> {MAX_PARAMS:,})")
    try:
        state = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    model = VisionTransformer(cfg).eval()
    if info.int8:
        model = load_int8(model, state, source=str(path))
    else:
        load_state(model, state, source=str(path))
    model = accelerate(model)  # (the speed paths stand aside by themselves for int8 layers and token merging)
    return model.set_tome(info.tome_r).eval()
