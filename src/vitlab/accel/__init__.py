"""Speed paths for the models of :mod:`vitlab.models`, behind one seam.

The model files are the paper; everything here makes the same computation faster on the CPU:

- :mod:`.onednn`: inference blocks on oneDNN's packed GEMMs with the biases, the GELU and the
  residual adds in their epilogues;
- :mod:`.fused_block`: a training block as one autograd node, with activation buffers kept
  between steps (:mod:`.buffers`) and fused C kernels compiled on first use (:mod:`.c_kernels`);
- :mod:`.vit`: the class-token-only last block and batch chunks for inference.

:func:`vitlab.create_model` and :func:`vitlab.load` return models with these paths
(:class:`FastVisionTransformer`, :class:`FastBlock`: subclasses with the same submodules and
parameter names). Each path runs only where it computes what the plain forward computes and
nobody could tell the difference (no hooks, no replaced or wrapped layers, no FSDP2 sharding, no
tracing); else the plain forward runs. One switch turns them all off::

    vitlab.accel.set_enabled(False)   # or VITLAB_ACCEL=0 in the environment
"""

from .blocks import FastBlock
from .switch import disabled, enabled, set_enabled
from .vit import INFERENCE_CHUNK_BYTES, FastVisionTransformer, accelerate, inference_path, training_path

__all__ = [
    "INFERENCE_CHUNK_BYTES",
    "FastBlock",
    "FastVisionTransformer",
    "accelerate",
    "disabled",
    "enabled",
    "inference_path",
    "set_enabled",
    "training_path",
]
