"""Which optimiser each parameter of a ViT goes to when the encoder's matrices are trained with Muon.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks") orthogonalises each update of a 2-D
weight by a Newton-Schulz iteration. ``torch.optim.Muon`` (recent torch only: vitlab takes torch >= 2.1, so a caller
checks that it exists) refuses any parameter that is not 2-D, and has no foreach or fused kernel. Muon is meant for the
hidden layers only: the CIFAR-10 record that uses it (airbench94_muon) and the language-model records train the
embeddings, the head, gains and biases with Adam(W) or SGD. For a ViT, :func:`muon_split` draws that line at the encoder
blocks of Eq. 2-3, the same line ``vitlab.train.engine.optim.layer_id`` draws for layer-wise learning rates: the 2-D
weights inside ``blocks.N`` (the attention's ``qkv`` and ``proj``, the MLP's ``fc1`` and ``fc2``; the rows and columns
of axial blocks alike) go to Muon; the patch embedding or CNN stem, the class, distillation and register tokens, the
position embeddings, every LayerNorm, layer scale and bias, the pooling (MAP, sequence pooling) and the head go to
AdamW.
"""

from __future__ import annotations

import re

from torch import nn

__all__ = ["BLOCK_PARAM", "muon_split"]

BLOCK_PARAM = re.compile(r"(?:^|\.)blocks\.(\d+)\.")
"""A parameter name inside encoder block N (``blocks.N.``, also under a wrapper's prefix: ``model.blocks.N.``)."""

Named = list[tuple[str, nn.Parameter]]


def muon_split(model: nn.Module) -> tuple[Named, Named]:
    """``(for Muon, for AdamW)``: the trainable parameters of ``model`` as ``(name, parameter)`` pairs, in the
    model's order; every 2-D weight of an encoder block to Muon, everything else to AdamW (see the module's
    docstring). Frozen parameters are in neither list. Both lists can be handed to the optimisers as they are
    (``torch.optim.Muon`` and ``AdamW`` take named parameters); the AdamW side's no-decay split is the caller's."""
    muon: Named = []
    adamw: Named = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (muon if p.ndim == 2 and BLOCK_PARAM.search(name) else adamw).append((name, p))
    return muon, adamw
