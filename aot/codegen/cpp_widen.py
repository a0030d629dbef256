"""bf16 conv nets on the CPU: the activations convs read, and the convs' epilogues, in fp32.

What it is: a rewrite of a CPU plan before ``pack_plan``. The CPU conv kernels are fp32 kernels: a bf16
model's packed, Winograd and depthwise convs widen their weights at build time and their input on every
call (conv.h), and each conv's epilogue rounds to bf16 as it stores. For a bf16 MobileNetV2 that per-call
widening and the epilogues that cannot take the register clamps (their bias is bf16) cost 1.5x the fp32
package's time. Here:
  - an arena tensor some conv reads as its input, or that only convs read (a residual their epilogues add),
    is stored in fp32 (unless a matmul or attention reads it: their bf16 operands feed the pairs kernels);
  - every conv's stores, and every store into such a tensor, compute in fp32 with no rounding between ops
    (``as_f32``); a bf16 destination still rounds once, as it stores;
  - the bf16 weights those stores load (biases, scales) and the depthwise convs' weights get fp32 copies,
    made at build time (``Packing.widened``).
Other kernels that load a widened tensor read it rounded to bf16, as they read it before.

Note (numerics): an activation a conv reads keeps fp32 precision, which is what the rows inside a fused
block already do (cpp_block.py) and what torch.compile's fused bf16 epilogues do; the result is as close
to the fp32 model as before, or closer. The model's inputs and outputs keep their dtypes.
What it is not: a precision pass for matmul models. Their bf16 activations feed the VDPBF16PS kernels.
"""

from __future__ import annotations

from dataclasses import replace

from .. import kernel as K
from ..ir import DType, Op
from ..memory import plan_memory
from .cpp_pack import Packing


def as_f32(v: K.Value, wide: set[str], copies: dict[str, str]) -> K.Value:
    """``v`` computed in fp32: bf16 nodes become fp32, roundings to bf16 go, loads of ``wide`` tensors read
    their fp32 storage, loads of the weights in ``copies`` read their fp32 copies, other bf16 loads widen."""

    def go(x: K.Value) -> K.Value:
        dt = DType.f32 if x.dtype is DType.bf16 else x.dtype
        if isinstance(x, K.Load):
            if x.buf in wide:
                return replace(x, dtype=DType.f32)
            if x.buf in copies:
                return replace(x, buf=copies[x.buf], dtype=DType.f32)
            return K.Unary(Op.CAST, x, DType.f32) if x.dtype is DType.bf16 else x
        if isinstance(x, (K.ReduceRef, K.Prefix)):
            return K.Unary(Op.CAST, x, DType.f32) if x.dtype is DType.bf16 else x
        if isinstance(x, K.Const):
            return replace(x, dtype=dt)
        if isinstance(x, K.Unary):
            inner = go(x.x)
            if x.op is Op.CAST and dt is DType.f32 and inner.dtype is DType.f32:
                return inner  # a rounding to bf16, or a widening of what is fp32 now
            return K.Unary(x.op, inner, dt)
        if isinstance(x, K.Binary):
            return K.Binary(x.op, go(x.a), go(x.b), dt)
        if isinstance(x, K.Where):
            return K.Where(go(x.cond), go(x.a), go(x.b), dt)
        if isinstance(x, K.Masked):
            return K.Masked(go(x.mask), go(x.body), x.other, dt)
        return x  # Acc (fp32 for float convs), Index

    return go(v)


def _rounded(v: K.Value, wide: set[str]) -> K.Value:
    """``v`` with each load of a ``wide`` tensor reading its fp32 storage rounded to bf16, as it read it before."""
    if isinstance(v, K.Load) and v.buf in wide:
        return K.Unary(Op.CAST, replace(v, dtype=DType.f32), DType.bf16)
    if isinstance(v, K.Unary):
        return replace(v, x=_rounded(v.x, wide))
    if isinstance(v, K.Binary):
        return replace(v, a=_rounded(v.a, wide), b=_rounded(v.b, wide))
    if isinstance(v, K.Where):
        return replace(v, cond=_rounded(v.cond, wide), a=_rounded(v.a, wide), b=_rounded(v.b, wide))
    if isinstance(v, K.Masked):
        return replace(v, mask=_rounded(v.mask, wide), body=_rounded(v.body, wide))
    return v


def _bf16_conv(k: K.Kernel) -> bool:
    return isinstance(k, K.Conv) and DType.bf16 in (k.x.dtype, k.w.dtype) and {k.x.dtype, k.w.dtype} <= {DType.f32, DType.bf16}


def _rewrite(k: K.Kernel, wide: set[str], copies: dict[str, str]) -> K.Kernel:
    """One kernel with the stores the module doc names in fp32 and loads of ``wide`` tensors at their storage."""
    convert = _bf16_conv(k)
    sts = tuple(
        K.Store(st.buf, st.index, as_f32(st.value, wide, copies) if convert or st.buf in wide else _rounded(st.value, wide))
        for st in K.stores(k)
    )
    if isinstance(k, K.Reduce):
        steps = tuple(replace(s, value=_rounded(s.value, wide)) for s in k.steps)
        out: K.Kernel = replace(k, steps=steps, row_stores=sts[: len(k.row_stores)], stores=sts[len(k.row_stores) :])
    elif isinstance(k, K.Scan):
        out = replace(k, value=_rounded(k.value, wide), stores=sts)
    else:
        out = replace(k, stores=sts)
    if isinstance(out, K.Conv) and out.x.buf in wide:
        out = replace(out, x=replace(out.x, dtype=DType.f32))
    if isinstance(out, K.Conv) and out.groups > 1 and out.w.buf in copies:
        out = replace(out, w=replace(out.w, buf=copies[out.w.buf], dtype=DType.f32))
    return out


def fp32_between_convs(plan: K.Plan) -> tuple[K.Plan, list[Packing]]:
    """``plan`` with bf16 convs' inputs and epilogues in fp32 (see the module doc), and the weights' fp32
    copies it reads (``Packing.widened``); ``plan`` itself when it has no bf16 conv."""
    convs = [k for k in plan.kernels if _bf16_conv(k)]
    if not convs:
        return plan, []
    library = {s.buf for k in plan.kernels if isinstance(k, K.Matmul | K.Attention)
               for s in ((k.a, k.b) if isinstance(k, K.Matmul) else k.operands)}  # fmt: skip
    arena16 = {b.name for b in plan.arena if b.dtype is DType.bf16}
    readers: dict[str, list[K.Kernel]] = {}
    for k in plan.kernels:
        for b in K.reads(k):
            readers.setdefault(b, []).append(k)
    only_convs = {b for b, ks in readers.items() if all(_bf16_conv(k) for k in ks)}
    wide = ({k.x.buf for k in convs if isinstance(k, K.Conv)} | only_convs) & arena16 - library
    weights = {b.name: b for b in plan.weights}

    def converted(k: K.Kernel, st: K.Store) -> bool:
        return _bf16_conv(k) or st.buf in wide

    # the bf16 weights the converted stores load, and the depthwise weights: fp32 copies
    wanted = {v.buf for k in plan.kernels for st in K.stores(k) if converted(k, st) for v in K.walk(st.value)
              if isinstance(v, K.Load) and v.buf in weights and weights[v.buf].dtype is DType.bf16}  # fmt: skip
    wanted |= {k.w.buf for k in convs if isinstance(k, K.Conv) and k.groups > 1 and k.w.dtype is DType.bf16}
    taken = {b.name for b in (*plan.inputs, *plan.outputs, *plan.weights, *plan.arena)}
    labels = dict(plan.labels)
    copies: dict[str, str] = {}
    packs: list[Packing] = []
    for src in sorted(wanted):
        name, label, j = f"{src}_f32", f"{labels.get(src, src)}.f32", 1
        while name in taken or label in labels.values():
            name, label, j = f"{src}_f32_{j}", f"{labels.get(src, src)}.f32.{j}", j + 1
        taken.add(name)
        labels[name] = label
        copies[src] = name
        packs.append(Packing.widened(name, src, int(weights[src].numel())))

    kernels = [_rewrite(k, wide, copies) for k in plan.kernels]
    arena = [replace(b, dtype=DType.f32) if b.name in wide else b for b in plan.arena]
    extra = [K.Buffer(p.name, p.dtype, p.shape, "weight") for p in packs]
    prog = K.Program(plan.symbols, plan.inputs, plan.outputs, [*plan.weights, *extra], arena, kernels, labels)
    return plan_memory(prog), packs
