"""The paper's models: the Vision Transformer (Eq. 1-4), its variants (hybrid, axial, position
embeddings, masked patch prediction) and the registry of named configurations. Nothing here
imports from the rest of vitlab except errors; the speed paths live in :mod:`vitlab.accel`."""

from .config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig
from .flexi import resample_patch_embed
from .flops import count_macs
from .layers import Attention, Block, DropPath, Mlp, PatchDropout, PatchEmbed
from .posemb import resample_posemb, sincos_2d
from .registry import VARIANTS, create_model, list_models, model_config, register, resolve_name
from .vit import VisionTransformer

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INCEPTION_MEAN",
    "INCEPTION_STD",
    "VARIANTS",
    "Attention",
    "Block",
    "DropPath",
    "Mlp",
    "PatchDropout",
    "PatchEmbed",
    "ViTConfig",
    "VisionTransformer",
    "count_macs",
    "create_model",
    "list_models",
    "model_config",
    "register",
    "resample_patch_embed",
    "resample_posemb",
    "resolve_name",
    "sincos_2d",
]
