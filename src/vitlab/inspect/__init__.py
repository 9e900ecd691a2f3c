"""The paper's analyses (Sec. 4.5, Appendix D.7-D.8): what a ViT learned and where it looks.

    from vitlab.inspect import attention_distance, rollout_map, filter_pca, posemb_similarity
    _, attns = model(x, return_attention=True)
    dist = attention_distance(attns, grid=(14, 14), patch_size=16)     # Fig. 7 right, (layers, heads)
    maps = rollout_map(attns, grid=(14, 14))                            # Fig. 6, (B, 14, 14)

``inspect_model`` (in :mod:`vitlab.inspect.report`) runs them all and writes the
figures and a self-contained ``report.html``; it is what ``vitlab inspect`` calls.

While a model trains, ``attention_health`` (:mod:`vitlab.inspect.health`) measures per layer the attention
distance, entropy, largest logit and outlier-token norms on a fixed batch, and ``health_alarms``
(:mod:`vitlab.inspect.alarms`) turns a series of them into plain-word alarms with the flag that helps
(``health_notes``: what the series shows that is expected of the data, such as no local heads on small data).
"""

from __future__ import annotations

from .alarms import AlarmThresholds, RunContext, health_alarms, health_notes
from .attention import (
    attention_distance,
    attention_rollout,
    output_token_attention,
    patch_centers,
    patch_distance_matrix,
    pixel_grid,
    rollout_map,
    uniform_attention_distance,
)
from .embeddings import filter_pca, patch_position_embeddings, posemb_similarity
from .health import attention_entropy, attention_health

__all__ = [
    "AlarmThresholds",
    "RunContext",
    "attention_distance",
    "attention_entropy",
    "attention_health",
    "attention_rollout",
    "filter_pca",
    "health_alarms",
    "health_notes",
    "inspect_model",
    "output_token_attention",
    "patch_centers",
    "patch_distance_matrix",
    "patch_position_embeddings",
    "pixel_grid",
    "posemb_similarity",
    "rollout_map",
    "uniform_attention_distance",
]


def __getattr__(name: str):  # matplotlib only when a report is made
    if name == "inspect_model":
        from .report import inspect_model

        return inspect_model
    raise AttributeError(f"module 'vitlab.inspect' has no attribute {name!r}")
