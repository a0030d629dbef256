"""Graph passes. Each takes a Graph and returns a new one; PIPELINE lists them once, in order."""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Graph
from .fold import dce, fold_constants, fold_conv_scale

Pass = Callable[[Graph], Graph]

PIPELINE: list[Pass] = [dce, fold_constants, fold_conv_scale, fold_constants]


def run_pipeline(g: Graph, check: Callable[[Graph, str], None] | None = None) -> Graph:
    for p in PIPELINE:
        g = p(g)
        if check is not None:
            check(g, p.__name__)
    return g
