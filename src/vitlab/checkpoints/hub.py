"""Names for the well-known public ViT checkpoints, fetched from the Hugging Face Hub.

``vitlab.load("augreg_in21k_ft_in1k/vit_b16")`` reads ``<tag>/<vitlab model name>``:

* tags ``augreg_in21k``, ``augreg_in21k_ft_in1k``, ``augreg2_in21k_ft_in1k``, ``augreg_in1k``
  (Steiner et al., "How to train your ViT?", 2021) and ``orig_in21k``, ``orig_in21k_ft_in1k``
  (the paper's own weights) come from timm's Hub repos (``timm/<arch>.<tag>``, ``model.safetensors``);
* ``google/...`` and ``google_in21k/...`` are the paper's weights as converted by Hugging Face
  (``google/vit-base-patch16-224`` ...), in ``save_pretrained`` format;
* a model name ending in ``_384`` is the checkpoint fine-tuned at 384 px.

Any ``timm/<arch>.<tag>`` repo id, and ``hf-hub:<owner>/<repo>`` for any other Hub repo (a ``save_pretrained``
folder, with its ``preprocessor_config.json`` when it has one: the mean, std and crop), also work; a plain
``<owner>/<repo>`` that is no known name is refused with the ``hf-hub:`` form. Downloads go through
``huggingface_hub`` (an optional dependency) and its cache. Without it, or offline, files put in
``<cache>/hub/<owner>--<repo>/`` (``$VITLAB_CACHE``, default ``~/.cache/vitlab``) are used; otherwise an
:class:`~vitlab.errors.OfflineError` says what to download and where to put it.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, OfflineError
from ..models.variants import BACKBONES, backbone_tag

__all__ = [
    "KNOWN",
    "HubEntry",
    "cache_dir",
    "card",
    "close_names",
    "is_hub_name",
    "list_names",
    "pretrained_name",
    "resolve",
]


@dataclass(frozen=True)
class HubEntry:
    """Where a named checkpoint lives: a Hub repo in ``timm`` (one weights file) or ``hf`` (folder) format."""

    repo_id: str
    kind: str  # "timm" | "hf"


_SIZES = {"tiny": "ti", "small": "s", "base": "b", "large": "l", "huge": "h"}

# timm's Hub repos of the original and AugReg weights (timm/<arch>.<tag>).
_TIMM = [
    "vit_tiny_patch16_224.augreg_in21k",
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "vit_tiny_patch16_384.augreg_in21k_ft_in1k",
    "vit_small_patch16_224.augreg_in21k",
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "vit_small_patch16_384.augreg_in21k_ft_in1k",
    "vit_small_patch32_224.augreg_in21k",
    "vit_small_patch32_224.augreg_in21k_ft_in1k",
    "vit_small_patch32_384.augreg_in21k_ft_in1k",
    "vit_small_patch16_224.augreg_in1k",
    "vit_small_patch16_384.augreg_in1k",
    "vit_base_patch8_224.augreg_in21k",
    "vit_base_patch8_224.augreg_in21k_ft_in1k",
    "vit_base_patch8_224.augreg2_in21k_ft_in1k",
    "vit_base_patch16_224.augreg_in21k",
    "vit_base_patch16_224.augreg_in21k_ft_in1k",
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "vit_base_patch16_384.augreg_in21k_ft_in1k",
    "vit_base_patch16_224.augreg_in1k",
    "vit_base_patch16_384.augreg_in1k",
    "vit_base_patch32_224.augreg_in21k",
    "vit_base_patch32_224.augreg_in21k_ft_in1k",
    "vit_base_patch32_384.augreg_in21k_ft_in1k",
    "vit_base_patch32_224.augreg_in1k",
    "vit_base_patch32_384.augreg_in1k",
    "vit_large_patch16_224.augreg_in21k",
    "vit_large_patch16_224.augreg_in21k_ft_in1k",
    "vit_large_patch16_384.augreg_in21k_ft_in1k",
    "vit_base_patch16_224.orig_in21k",
    "vit_base_patch32_224.orig_in21k",
    "vit_large_patch16_224.orig_in21k",
    "vit_large_patch32_224.orig_in21k",
    "vit_huge_patch14_224.orig_in21k",
    "vit_base_patch16_224.orig_in21k_ft_in1k",
    "vit_base_patch16_384.orig_in21k_ft_in1k",
    "vit_large_patch32_384.orig_in21k_ft_in1k",
]

# Hugging Face's conversions of the paper's weights (google/vit-<size>-patch<p>-<res>[-in21k]).
_GOOGLE = [
    "vit-base-patch16-224",
    "vit-base-patch16-384",
    "vit-base-patch32-384",
    "vit-large-patch16-224",
    "vit-large-patch16-384",
    "vit-large-patch32-384",
    "vit-base-patch16-224-in21k",
    "vit-base-patch32-224-in21k",
    "vit-large-patch16-224-in21k",
    "vit-large-patch32-224-in21k",
    "vit-huge-patch14-224-in21k",
]


def _vitlab_name(size: str, patch: str, res: str) -> str:
    return f"vit_{_SIZES[size]}{patch}" + ("" if res == "224" else f"_{res}")


def _build() -> dict[str, HubEntry]:
    table: dict[str, HubEntry] = {}
    for arch_tag in _TIMM:
        arch, tag = arch_tag.split(".")
        size, patch, res = re.fullmatch(r"vit_([a-z]+)_patch(\d+)_(\d+)", arch).groups()  # type: ignore[union-attr]
        table[f"{tag}/{_vitlab_name(size, patch, res)}"] = HubEntry(f"timm/{arch_tag}", "timm")
    for repo in _GOOGLE:
        m = re.fullmatch(r"vit-([a-z]+)-patch(\d+)-(\d+)(-in21k)?", repo)
        size, patch, res, i21k = m.groups()  # type: ignore[union-attr]
        table[f"google{'_in21k' if i21k else ''}/{_vitlab_name(size, patch, res)}"] = HubEntry(f"google/{repo}", "hf")
    return table


KNOWN: dict[str, HubEntry] = _build()


def list_names() -> list[str]:
    """All known checkpoint names."""
    return sorted(KNOWN)


def card(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``(config fields, metadata)`` known of the public checkpoint ``name`` beyond its files: the evaluation
    crop its publisher uses (timm's ``crop_pct``: 0.9 at 224 px, 1.0 at 384 for the timm repos; 1.0 for
    Hugging Face's conversions, whose preprocessor resizes without cropping), and its Hub repo
    (``hf_hub_id``) and licence (Apache 2.0 for all of :data:`KNOWN`). A ``config.json`` downloaded with
    the weights states the crop too and takes precedence."""
    entry = _entry(name)
    if entry is None:
        return {}, {}
    meta = {"hf_hub_id": entry.repo_id}
    if name not in KNOWN:
        return {}, meta
    meta["license"] = "apache-2.0"
    if entry.kind == "hf":
        return {"crop_pct": 1.0}, meta
    return {"crop_pct": 0.9 if entry.repo_id.split(".")[0].endswith("_224") else 1.0}, meta


def _entry(name: str) -> HubEntry | None:
    if name in KNOWN:
        return KNOWN[name]
    if re.fullmatch(r"timm/[\w.-]+", name):
        return HubEntry(name, "timm")
    m = re.fullmatch(r"hf-hub:([\w.-]+/[\w.-]+)", name)
    if m:
        return HubEntry(m.group(1), "hf")
    return None


_PREFERRED_TAGS = (
    "augreg2_in21k_ft_in1k",
    "augreg_in21k_ft_in1k",
    "orig_in21k_ft_in1k",
    "augreg_in1k",
    "augreg_in21k",
    "orig_in21k",
)


def pretrained_name(model: str) -> str:
    """The public checkpoint ``create_model(model, pretrained=True)`` loads: ``timm/<arch>.<tag>`` for a
    timm name with its tag (``vit_base_patch16_224.augreg_in1k``), a DeiT name (the ``fb_in1k``
    weights) or one of the backbones of :data:`~vitlab.models.variants.BACKBONES` (timm's default tag:
    ``vit_small_patch16_dinov3`` gives ``timm/vit_small_patch16_dinov3.lvd1689m``), else the first of the
    ImageNet-1k fine-tuned, then pre-trained, tags that exists for the model (``vit_b16`` and
    ``vit_base_patch16_224`` give ``augreg2_in21k_ft_in1k/vit_b16``)."""
    n = model.strip().lower()
    if re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", n):
        return f"timm/{n}"
    if n in BACKBONES:  # EVA-02, DINOv3, PE core, SigLIP 2: timm's default weights for the name
        return f"timm/{n}.{backbone_tag(n)}"
    if n.startswith("deit_"):
        return f"timm/{n}.fb_in1k"
    m = re.fullmatch(r"vit_([a-z]+)_patch(\d+)_(\d+)", n)
    ours = _vitlab_name(*m.groups()) if m and m.group(1) in _SIZES else n
    for tag in _PREFERRED_TAGS:
        if f"{tag}/{ours}" in KNOWN:
            return f"{tag}/{ours}"
    raise CheckpointError(f"{model}: no public weights are known for this model; pass checkpoint_path=... instead")


def close_names(name: str) -> list[str]:
    """Up to three known checkpoint names close to ``name``, closest first."""
    return difflib.get_close_matches(name, list(KNOWN), n=3, cutoff=0.6)


def is_hub_name(name: str) -> bool:
    """``name`` is a known checkpoint name or a Hub repo reference (not checked online)."""
    return _entry(name) is not None


def cache_dir() -> Path:
    """Where manually downloaded files are looked for: ``$VITLAB_CACHE/hub`` (default ``~/.cache/vitlab/hub``)."""
    return Path(os.environ.get("VITLAB_CACHE") or Path.home() / ".cache" / "vitlab") / "hub"


def _files(entry: HubEntry) -> list[tuple[str, ...]]:
    """Alternatives, each a tuple of files that must all be fetched (the first is the weights)."""
    if entry.kind == "timm":
        return [("model.safetensors",), ("pytorch_model.bin",)]
    return [("model.safetensors", "config.json"), ("pytorch_model.bin", "config.json")]


def resolve(name: str) -> Path:
    """A local path for a checkpoint name: a weights file (timm) or a folder (Hugging Face).

    Looks in vitlab's manual-download folder first, then downloads (cached) with
    ``huggingface_hub.hf_hub_download``.
    """
    entry = _entry(name)
    if entry is None:
        close = close_names(name)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `vitlab models --pretrained` lists the names"
        if re.fullmatch(r"[\w.-]+/[\w.-]+", name):  # a Hub repo id as Hugging Face writes it: timm's prefix says so
            hint += f" (a Hugging Face Hub repo: hf-hub:{name})"
        raise CheckpointError(f"{name}: no such file or folder, and not a known checkpoint name{hint}")
    local = cache_dir() / entry.repo_id.replace("/", "--")
    for files in _files(entry):
        if all((local / f).is_file() for f in files):
            return local / files[0] if entry.kind == "timm" else local
    url = f"https://huggingface.co/{entry.repo_id}/resolve/main"
    wanted = " and ".join(f"{url}/{f}" for f in _files(entry)[0])
    advice = f"download {wanted} into {local}/ (or pass the downloaded file or folder to vitlab.load)"
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise OfflineError(
            f"{name}: huggingface_hub is not installed (pip install 'vitlab[hub]'); or {advice}"
        ) from None
    from huggingface_hub import constants

    offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
    unreachable = None if offline else _unreachable(constants.ENDPOINT)
    hint = "" if offline else "; offline, set HF_HUB_OFFLINE=1 to use only cached files without trying the network"
    cache_only = offline or unreachable is not None  # (unreachable: huggingface_hub's retries would wait ~30 s)
    last: Exception | None = None
    for files in _files(entry):
        try:
            kw = {"local_files_only": True} if cache_only else {}
            paths = [Path(hf_hub_download(repo_id=entry.repo_id, filename=f, **kw)) for f in files]
        except Exception as e:  # not cached, EntryNotFound -> try the next alternative; network errors -> below
            last = e
            if cache_only or type(e).__name__ in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
                continue
            break
        if entry.kind == "hf":  # optional: the image processor's mean, std and crop (DeiT's are ImageNet's, 0.875)
            with contextlib.suppress(Exception):
                hf_hub_download(repo_id=entry.repo_id, filename="preprocessor_config.json", **kw)
            return paths[0].parent
        with contextlib.suppress(Exception):  # optional: timm's config.json (pooling, labels) lands beside the weights
            hf_hub_download(repo_id=entry.repo_id, filename="config.json", **kw)
        return paths[0]
    if unreachable:
        raise OfflineError(f"{name}: not in the Hub cache and {unreachable}{hint}; or {advice}")
    if offline:
        raise OfflineError(f"{name}: not in the Hub cache, and HF_HUB_OFFLINE allows no download; or {advice}")
    reason = str(last).strip().splitlines()[0] if last and str(last).strip() else type(last).__name__
    raise OfflineError(
        f"{name}: cannot download from the Hugging Face Hub ({entry.repo_id}: {reason}){hint}; or {advice}"
    )


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _unreachable(endpoint: str, *, timeout: float = 3.0) -> str | None:
    """Why the Hub at ``endpoint`` cannot be reached, found within ``timeout`` seconds (one TCP
    connection), or None when it can -- or when a proxy is configured and only the download itself
    can tell. Lets a machine without network fail at once instead of after huggingface_hub's retries."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port} cannot be reached ({type(e).__name__}: {e})"
    return None
