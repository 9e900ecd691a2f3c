"""The processes' parallelism around the trained module (:func:`distribute`): DistributedDataParallel by default,
or with ``--fsdp`` parameters, gradients and optimizer state sharded over the processes with PyTorch's FSDP2.

``torch.distributed.fsdp.fully_shard`` is applied to every encoder block and then to the root (the
stem, position embeddings, final norm and head: the parameters no block holds), as PyTorch's FSDP2
tutorial and torchtitan do. Each process keeps ``1/N`` of every weight; a block's full weights exist
only while its forward or backward runs (all-gathered before, freed after), and its gradients are
reduce-scattered back to the shards. ``--grad-checkpointing`` composes with it: the block's forward is
recomputed in the backward pass while its weights are gathered for the backward anyway.

Precision: on CUDA (``--precision auto`` or ``bf16``) a :class:`MixedPrecisionPolicy` gathers the weights
in bfloat16 and reduces the gradients in float32, over float32 shards and float32 optimizer state; on
the CPU everything stays float32. A run with ``--fsdp`` and one process shards over a group of one
(:func:`vitlab.distributed.setup`): the same code path, and the same checkpoint format.

What the sharded model changes for the rest of the run, and where it is handled:

- checkpoints: ``torch.distributed.checkpoint`` folders (:mod:`vitlab.train.persist.dcp`), not ``last.pt``'s tensors;
- the exported ``model/``: the full weights gathered to rank 0 as a plain model (:func:`full_model`);
- evaluation: every forward is a collective, so ranks whose shard of the evaluation split has fewer
  batches run throw-away forwards until all are done (:func:`lockstep`);
- the speed paths of :mod:`vitlab.accel` stand aside for sharded modules (:func:`vitlab.accel.switch.sharded`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ...devices import autocast
from ...distributed import Dist, any_rank
from ..conf.phases import ends_dropping
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig

__all__ = ["ddp_memory_hint", "distribute", "full_model", "lockstep", "shard", "shard_line"]


def ddp_memory_hint(params: int, *, world_size: int, device_memory: int) -> str | None:
    """A line suggesting ``--fsdp`` when a DDP run's model states alone (16 bytes a parameter: fp32 weights
    and gradients, AdamW's two moments; what ``vitlab plan`` counts) take more than half of each device's
    ``device_memory`` bytes; None otherwise. DDP stays the default: the choice changes the checkpoint's
    format, so it is the user's."""
    states = 16 * params
    if world_size < 2 or states <= device_memory / 2:
        return None
    return (
        f"note: weights, gradients and AdamW state take {states / 2**30:.1f} GiB on each of the {world_size} "
        f"devices under DDP ({device_memory / 2**30:.0f} GiB each); --fsdp shards them "
        f"({states / world_size / 2**30:.1f} GiB each; see vitlab plan)"
    )


def _bf16(device: torch.device, amp_dtype: torch.dtype | None) -> bool:
    """Whether the sharded weights are gathered in bfloat16 (CUDA, ``--precision auto`` or ``bf16``)."""
    return device.type == "cuda" and amp_dtype == torch.bfloat16


def shard(
    net: nn.Module,
    *,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    blocks: list[nn.Module] | None = None,
) -> nn.Module:
    """Apply ``fully_shard`` to each encoder block (``blocks``: those of the ViT inside an objective's module;
    None: ``net``'s own), then to ``net`` itself; in place, and returned. ``amp_dtype`` bfloat16 on CUDA: bf16
    weights and compute, float32 gradient reduction."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if _bf16(device, amp_dtype):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in list(net.blocks) if blocks is None else blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    return net


def shard_line(net: nn.Module, d: Dist, *, device: torch.device, amp_dtype: torch.dtype | None, blocks: int) -> str:
    """What :func:`shard` did, in one line for the run's log."""
    n = sum(p.numel() for p in net.parameters())  # DTensors count their global size
    precision = "bf16 weights and compute, fp32 gradient reduction" if _bf16(device, amp_dtype) else "fp32"
    return f"FSDP2: {n:,} parameters sharded over {d.world_size} process(es), {blocks} blocks + root, {precision}"


def full_model(model: nn.Module, d: Dist) -> nn.Module | None:
    """The full weights of the sharded ``model`` (a ViT inside an FSDP2 tree) as a plain model of its
    class on the CPU, on rank 0; None on the other ranks. A collective: every rank calls it. The
    copy is built on the meta device and takes the gathered tensors, so no second initialisation
    runs and rank 0 holds the weights once."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not d.is_main:
        return None
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        plain = cls(model.config)
    plain.load_state_dict(state, assign=True)
    return plain


def lockstep(
    batches: Iterable[Any],
    *,
    net: nn.Module,
    d: Dist,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    config: Any = None,
) -> Iterator[Any]:
    """``batches`` (this rank's shard of the evaluation split), kept in step with the other ranks: a
    sharded forward gathers weights from every rank, so a rank that has run out of batches runs
    throw-away forwards of one blank image through ``net`` until every rank is done. The global RNG
    is left as it was (an objective's module draws its masks from it). ``config``: the ViT's (None: ``net``'s)."""
    cfg = net.config if config is None else config
    it = iter(batches)
    while True:
        batch = next(it, None)
        if not any_rank([batch is not None], d)[0]:
            return
        if batch is not None:
            yield batch
            continue
        blank = torch.zeros(1, cfg.in_chans, *cfg.img_size, device=device)
        with torch.no_grad(), torch.random.fork_rng(devices=[]), autocast(device, amp_dtype):
            net(blank)


def distribute(
    net: nn.Module,
    cfg: TrainConfig,
    recipe: Recipe,
    *,
    dist: Dist,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    blocks: list[nn.Module] | None = None,
    unused: bool = False,
) -> nn.Module:
    """The module the training steps call: ``net`` sharded in place with ``--fsdp``
    (:func:`shard`; ``amp_dtype`` picks its precision), else inside
    DistributedDataParallel when there are several processes; compiled with ``--compile`` (one static graph per
    shape when ``recipe`` changes the input's)."""
    run_model: nn.Module = net
    if cfg.fsdp:
        run_model = shard(net, device=device, amp_dtype=amp_dtype, blocks=blocks)
    elif dist.enabled:  # ``unused``: the objective leaves parameters without gradients (MPP: the ViT's head)
        run_model = nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=unused
        )
    if not cfg.compile:
        return run_model
    # a resolution schedule changes the input size once or twice, ending token dropping the sequence length once:
    # one static graph per shape, since inductor's symbolic-shape code generation did not finish for the hybrid
    # stem's backward (docs/speedrun.md)
    return torch.compile(run_model, dynamic=False if recipe.res_schedule or ends_dropping(recipe) else None)
