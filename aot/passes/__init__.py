"""Graph passes. Each takes a Graph and returns a new one, leaving its input unchanged (``rewrite`` does the
bookkeeping); PIPELINE lists them once, in order.

What it is not: fusion (``fusion.py``, Graph -> Program) or memory planning (``memory.py``, Program -> Plan).
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Graph
from .fold import dce, fold_constants, fold_conv_scale
from .layout import channels_last_nodes, conv_weights_channels_last
from .linear import flatten_linear
from .merge import merge_matmuls
from .rewrite import rewrite

Pass = Callable[[Graph], Graph]

__all__ = [
    "PIPELINE", "Pass", "channels_last_nodes", "conv_weights_channels_last", "dce", "flatten_linear", "fold_constants",
    "fold_conv_scale", "merge_matmuls", "rewrite", "run_pipeline",
]  # fmt: skip

# the layout pass comes last: constant folding would fold its weight permutes back
PIPELINE: list[Pass] = [
    dce, fold_constants, fold_conv_scale, flatten_linear, fold_constants, merge_matmuls, conv_weights_channels_last,
]


def run_pipeline(g: Graph, check: Callable[[Graph, str], None] | None = None) -> Graph:
    """Every pass in order; ``check(graph, pass name)`` (the verifier, say) runs after each."""
    for p in PIPELINE:
        g = p(g)
        if check is not None:
            check(g, p.__name__)
    return g
