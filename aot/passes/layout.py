"""Channels-last memory layout for convolution networks, decided at build time.

What it is: ``conv_weights_channels_last``, a pass that stores every conv weight in the order the kernels read
it ([O, kh, kw, I]; depthwise [kh, kw, C, 1]) behind an explicit PERMUTE back to OIHW, and
``channels_last_nodes``, the activations fusion stores as NHWC.
What it is not: a rewrite of the ops into NHWC forms. The IR keeps NCHW meaning throughout.

Note: the design. Instead of pushing permutes through the graph until they cancel, the layout of an
activation is a property of the *buffer* that realizes it: fusion stores a channels-last node's buffer with
NHWC strides (``Fusion.strides``) and every reader already goes through strides (loads, the conv and matmul
operands, views), so the memory layout is NHWC between convolutions while every op keeps its NCHW meaning,
the verifier and interpreters are untouched, and the fused epilogues (bias, batch-norm, ReLU, residual add)
stay where they were. Graph inputs and outputs are never channels-last (their buffers are user-facing), so
the layout the user sees does not change; an op that needs another layout reads through strides or, where
strides cannot express the view (a matmul over a flattened NHWC buffer), fusion realizes a copy as it does
for any view. Weights are different: they are data, so the permute is done once here and stored.
The weight pass must run after constant folding (which would fold the permute back into OIHW data).
"""

from __future__ import annotations

import numpy as np

from ..ir import ConvAttr, Family, Graph, Node, Op, PermuteAttr, TensorType, WeightAttr, shapes_equal
from .fold import dce
from .rewrite import rewrite

NHWC = (0, 2, 3, 1)  # the storage order of a channels-last NCHW tensor (numpy transpose order)


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(perm)
    for k, p in enumerate(perm):
        out[p] = k
    return tuple(out)


def is_depthwise(conv: Node) -> bool:
    a = conv.attr
    assert isinstance(a, ConvAttr)
    x, w = conv.inputs
    return a.groups > 1 and w.shape[1] == 1 and x.shape[1] == a.groups and conv.shape[1] == a.groups


def weight_order(conv: Node) -> tuple[int, ...]:
    """The storage order of a conv's OIHW weight: the reduction (kh, kw, c) contiguous per output channel,
    or for a depthwise conv the channels contiguous per tap (its kernel reads one tap for a channel tile)."""
    return (2, 3, 0, 1) if is_depthwise(conv) else NHWC


def conv_weights_channels_last(g: Graph) -> Graph:
    """conv(x, W)  ->  conv(x, permute(W')) with W' = W stored in ``weight_order``: no per-call work."""
    weights = dict(g.weights)
    done: dict[tuple[Node, tuple[int, ...]], Node] = {}

    def fold(n: Node, _old: Node) -> Node | None:
        if n.op is not Op.CONV2D:
            return None
        w = n.inputs[1]
        if not isinstance(w.attr, WeightAttr) or not all(isinstance(d, int) for d in w.shape):
            return None
        order = weight_order(n)
        key = (w, order)
        if key not in done:
            name = f"{w.attr.name}.nhwc"
            while name in weights:
                name += "_"
            weights[name] = np.ascontiguousarray(weights[w.attr.name].transpose(order))
            stored = Node(Op.WEIGHT, (), TensorType(w.dtype, tuple(w.shape[p] for p in order)), WeightAttr(name), w.source)
            done[key] = Node(Op.PERMUTE, (stored,), w.type, PermuteAttr(inverse(order)), w.source)
        return Node(Op.CONV2D, (n.inputs[0], done[key]), n.type, n.attr, n.source)

    return dce(rewrite(g, fold, weights))


def channels_last_nodes(g: Graph) -> frozenset[Node]:
    """The 4-D activations to store NHWC when realized: conv and pool results, and elementwise ops of the
    same shape over them (batch-norm affine, activations, residual adds), so a network's buffers between
    convolutions are all channels-last. Everything else keeps row-major NCHW."""
    out: set[Node] = set()
    for n in g.nodes:
        if n.type.rank != 4:
            continue
        if n.op in (Op.CONV2D, Op.POOL2D) or (
            n.op in Family.ELEMENTWISE and any(i in out and shapes_equal(i.shape, n.shape) for i in n.inputs)
        ):
            out.add(n)
    return frozenset(out)
