"""Moved to :mod:`vitlab.distributed` (this name goes when every caller has moved)."""

from ..distributed import Dist, all_reduce_sum, any_rank, barrier, broadcast_ints, setup, teardown

__all__ = ["Dist", "all_reduce_sum", "any_rank", "barrier", "broadcast_ints", "setup", "teardown"]
