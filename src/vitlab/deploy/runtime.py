"""Running an exported folder the way a vitlab model runs: :func:`open_exported`, the one way vitlab opens an
export (``vitlab predict``, ``vitlab eval`` and the agreement report of ``vitlab export`` all go through it), gives
an :class:`ExportedModel`, an ``nn.Module`` with the model's ``config`` (preprocessing, class names) whose
``forward`` maps normalised ``pixel_values`` to logits, so they feed it exactly as they feed the model it came from:
the model's own logits, also where the file holds its calibration temperature baked in (``export.temperature``: the
graph's output is multiplied back by it, and the config carries it, so the probabilities are calibrated as the
model's are: :func:`vitlab.evaluate.calibration.model_temperature`).

- ONNX (float or int8): an onnxruntime session on the CPU of the checked graph (:mod:`.graph`): control flow
  refused in any graph, its input and output shapes held against the config, and a graph whose content hash is
  not the one the folder's config records run under a time limit;
- ``torch`` (``model.safetensors``, float or int8): vitlab's eager model rebuilt from tensors only;
- TorchScript: only with ``trust_torchscript=True``: loading it runs the code stored in the file.

An int8 folder whose report measured its float32 model faster at some batch size holds both and serves each
batch with the one its config names (``export.by_batch``). NaN or infinite weights, or outputs, are an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._fs import default_file_mode, replacing
from ..errors import CheckpointError, ConfigError
from ..evaluate.calibration import TEMPERATURE_KEY
from ..models.config import ViTConfig
from ..models.tome import merge_schedule
from .folder import ExportInfo, hashed_files, read_export
from .graph import GraphSession, file_digest, open_session, read_graph, run_seconds
from .model_file import load_exported

__all__ = ["ExportedModel", "is_verified", "open_exported", "save_torch"]


class ExportedModel(nn.Module):
    """An exported model behind vitlab's model interface: ``config`` (a :class:`ViTConfig`: img_size,
    mean, std, class names ...), ``export`` (what was exported), ``forward(pixel_values) -> logits``.
    It always runs on the CPU: inputs on another device are copied over and the logits copied back."""

    def __init__(
        self,
        *,
        config: ViTConfig,
        export: ExportInfo,
        runners: dict[str, Any],
        folder: Path,
        verified: bool = True,
    ) -> None:
        super().__init__()
        self.config = config
        self.export = export
        self.folder = folder
        self.runners = runners
        """``{"int8" | "float32": runner}``: an onnxruntime session, a ScriptModule, or a (possibly int8)
        VisionTransformer; which serves a batch is :meth:`ExportInfo.graph_for` its size."""
        self.verified = verified
        """Every model file has the content hash the config records (vitlab wrote it as it is)."""

    @property
    def runner(self) -> Any:
        """The model that serves a batch of one."""
        return self.runners[self._kind(1)]

    def _kind(self, batch: int) -> str:
        kind = self.export.graph_for(batch)
        return kind if kind in self.runners else next(iter(self.runners))

    @property
    def tome_r(self) -> int:
        return self.export.tome_r

    def set_tome(self, r: int) -> ExportedModel:
        """Token merging is fixed in an exported graph: ``r`` must merge as the exported one does (``--tome 100``
        on a folder that merges 8 per block, the most its model can, is that same schedule)."""
        cfg = self.config
        same = isinstance(r, int) and merge_schedule(cfg.num_patches, cfg.depth, max(0, r)) == merge_schedule(
            cfg.num_patches, cfg.depth, self.export.tome_r
        )
        if not same:
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
        runner = self.runners[self._kind(len(x))]
        if isinstance(runner, nn.Module):  # (a ScriptModule is one)
            try:
                with torch.inference_mode():
                    out = runner(x).float()
            except RuntimeError as e:  # a TorchScript program or tensors that do not fit its config
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise CheckpointError(f"{self.folder}: the model cannot run on {tuple(x.shape)} ({first})") from None
        else:
            out = torch.from_numpy(runner.logits(x.numpy()))
        if self.export.temperature is not None:  # the graph's logits are calibrated: the model's own, as every model
            out = out * self.export.temperature
        if not bool(torch.isfinite(out).all()):
            raise CheckpointError(
                f"{self.folder}: the model answers NaN or infinity for a batch of {len(x)} images; its output "
                "cannot be trusted"
            )
        return out.to(pixel_values.device)


def is_verified(folder: Path, info: ExportInfo) -> bool:
    """Whether every model file of the folder has the content hash its config records."""
    if not info.sha256:
        return False
    wanted = [n for n in info.files() if n != "model.onnx.data"]
    return all(info.sha256.get(n) == file_digest(hashed_files(folder, n)) for n in wanted)


def open_exported(
    folder: str | os.PathLike[str],
    *,
    trust_torchscript: bool = False,
    threads: int | None = None,
    only: str | None = None,
) -> ExportedModel:
    """The exported model in ``folder`` (its config checked: :func:`.folder.read_export`), ready to run: the one
    way vitlab opens an export. TorchScript is refused unless ``trust_torchscript``. ``threads``: onnxruntime's
    intra-op threads (default: its own). ``only``: ``"float32"`` opens an int8 export's float32 model alone (the
    report times it before the folder says which serves which batch)."""
    p = Path(folder)
    cfg, info = read_export(p)
    if info.temperature is not None:  # what vitlab.evaluate.calibration.model_temperature reads, as of a model
        cfg = cfg.replace(extra={**cfg.extra, TEMPERATURE_KEY: info.temperature})
    trusted = is_verified(p, info)
    files = {"int8" if info.int8 else "float32": info.file}
    if info.serves_float or only == "float32":
        files["float32"] = info.float_file
    if only is not None:
        files = {only: files[only]}
    runners = {}
    for kind, name in files.items():
        path = p / name
        if not path.is_file():
            raise CheckpointError(f"{p}: the exported folder lacks {name} (copy the whole folder)")
        if info.format == "onnx":
            runners[kind] = _onnx(path, cfg, info, threads=threads, trusted=trusted)
        elif info.format == "torchscript":
            if not trust_torchscript:
                raise ConfigError(
                    f"--model {p}: a TorchScript export runs the code stored in {name} when loaded; pass "
                    "--trust-torchscript if you trust where it came from (or export --format onnx)"
                )
            runners[kind] = load_exported(path, format="torchscript")
        else:
            runners[kind] = _load_torch(path, cfg, info, int8=kind == "int8")
    return ExportedModel(config=cfg, export=info, runners=runners, folder=p, verified=trusted).eval()


def _onnx(path: Path, cfg: ViTConfig, info: ExportInfo, *, threads: int | None, trusted: bool) -> GraphSession:
    """The folder's graph, checked (:func:`.graph.read_graph`) and held against its config: input channels and
    size, classes, opset. Untrusted (no matching hash): run under a time limit."""
    from ..models.flops import count_macs

    facts = read_graph(path)
    want_in = (cfg.in_chans, *cfg.img_size)
    got_in = facts.input_shape[1:]
    if any(g is not None and g != w for g, w in zip(got_in, want_in)):
        raise CheckpointError(
            f"{path}: the graph takes {'x'.join(str(d) for d in got_in)} inputs, its config.json says "
            f"{'x'.join(str(d) for d in want_in)} (in_chans, img_size); the graph and the config do not fit"
        )
    classes = facts.output_shape[1]
    if classes is not None and classes != cfg.num_classes:
        raise CheckpointError(
            f"{path}: the graph gives {classes} logits, its config.json says {cfg.num_classes} classes; the graph "
            "and the config do not fit"
        )
    if info.opset is not None and facts.opset != info.opset:
        raise CheckpointError(f"{path}: the graph is opset {facts.opset}, its config.json says {info.opset}")
    macs = count_macs(cfg)
    limit = None if trusted else (lambda batch: run_seconds(macs, batch))
    return open_session(path, threads=threads, limit=limit, facts=facts)


def save_torch(model: nn.Module, path: Path, *, int8: bool) -> None:
    """``model`` (float, or made by :func:`.quantize.torch_dynamic` when ``int8``) as tensors in ``path``."""
    from safetensors.torch import save_file

    from .quantize import int8_state

    state = int8_state(model) if int8 else {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with replacing(path, what="the model") as tmp:  # (a link there is replaced, never written through)
        save_file(state, str(tmp), metadata={"format": "pt"})
        os.chmod(tmp, default_file_mode())  # safetensors creates it private (0600)


def _load_torch(path: Path, cfg: ViTConfig, info: ExportInfo, *, int8: bool) -> nn.Module:
    """vitlab's eager model from a ``torch`` export: built from the checked config (within the parameter cap
    :func:`vitlab.load` applies), the tensors loaded strictly (every float one finite), int8 layers rebuilt,
    token merging set."""
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
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: {name} holds NaN or infinite values; the model cannot predict")
    model = VisionTransformer(cfg).eval()
    if int8:
        model = load_int8(model, state, source=str(path))
    else:
        load_state(model, state, source=str(path))
    model = accelerate(model)  # (the speed paths stand aside by themselves for int8 layers and token merging)
    return model.set_tome(info.tome_r).eval()
