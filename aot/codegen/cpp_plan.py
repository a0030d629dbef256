"""A CPU target's plan: the shared kernel plan rewritten for one CPU level, in order:
``fp32_between_convs`` (cpp_widen.py: a bf16 conv net's activations and conv epilogues in fp32),
``pack_plan`` (cpp_pack.py: weights packed at build time into the kernels' layouts), ``fuse_pools``
(cpp_pool.py: a max-pool fused into the conv before it)."""

from __future__ import annotations

from .. import kernel as K
from .cpp_pack import Packing, pack_plan
from .cpp_pool import fuse_pools
from .cpp_widen import fp32_between_convs


def cpu_plan(plan: K.Plan, level: str, winograd: bool = True) -> tuple[K.Plan, list[Packing]]:
    """``plan`` for the CPU level ``level``, and the weights it reads packed (``pack_array`` makes each)."""
    plan, widened = fp32_between_convs(plan)
    plan, packs = pack_plan(plan, level, winograd)
    return fuse_pools(plan), [*widened, *packs]
