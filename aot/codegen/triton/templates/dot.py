"""What the ``tl.dot`` templates share: accumulator types, the dot line, and binding the
output tile's indices and masks so that epilogues print through ``Gen`` like pointwise kernels.

Note: fp32 convolutions run as three TF32 products on the tensor cores from sm_80 on ("tf32x3": each operand
split into a TF32 head and tail, the tail x tail term dropped, so a product keeps ~21 bits where ieee FMA keeps
24: fp32-level results at tensor-core speed); other fp32 dots as ieee FMA (``configs.tensor_f32`` says why).
A build that asks for bf16/fp16 rounds operands to that type and accumulates in fp32; tf32 is the explicit
opt-in to one TF32 product (~1e-3). Operand types ``tl.dot`` cannot take (fp64, integers) use a
broadcast-multiply-sum over small tiles: slow, but exact.
"""

from __future__ import annotations

from ....ir import DType
from ....options import BuildOptions
from ..configs import Shape, choose, dot_mode, tensor_f32
from ..values import XR, Gen, R, X

DOT_TYPES = (DType.f32, DType.f16, DType.bf16)


def acc_dtype(a: DType, b: DType) -> DType:
    if a in DOT_TYPES and b in DOT_TYPES:
        return DType.f32
    if a is DType.f64 or b is DType.f64:
        return DType.f64
    return DType.i64


def dot_line(a: str, b: str, dt: DType, options: BuildOptions, sm: int, kind: str = "matmul") -> str:
    """``acc`` += a @ b for tiles of operand type ``dt`` on ``sm``, in a ``kind`` template."""
    if dt is DType.f32 and options.precision in ("bf16", "fp16"):
        half = "tl.bfloat16" if options.precision == "bf16" else "tl.float16"
        return f"acc = tl.dot({a}.to({half}), {b}.to({half}), acc)"
    if dt is DType.f32 and options.precision == "tf32":
        return f'acc = tl.dot({a}, {b}, acc, input_precision="tf32")'
    if dt is DType.f32:
        return f'acc = tl.dot({a}, {b}, acc, input_precision="{"tf32x3" if tensor_f32("f32", sm, kind) else "ieee"}")'
    if dt in DOT_TYPES:
        return f"acc = tl.dot({a}, {b}, acc)"
    return f"acc = acc + tl.sum({a}[:, :, None].to(acc.dtype) * {b}[None, :, :].to(acc.dtype), axis=1)"


def tile_sizes(
    m: int, n: int, dt: DType, sm: int, options: BuildOptions, k: int = 1024
) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for an (m x k) @ (k x n) problem: a thin wrapper
    over ``configs.choose`` kept for templates not yet taking a ``Config``."""
    c, _ = choose(Shape("matmul", dot_mode(dt, options), m, n, k), sm)
    return c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages


def bind(g: Gen, name: str, code: str, axes: frozenset[str]) -> None:
    g.w.line(f"{name} = {code}")
    g.loopvars[name] = (name, axes)
    g.axes[name] = axes


def masks(g: Gen, rows: str, cols: str) -> None:
    """``omask`` over the output tile, with its row and column factors for loads that need only one."""
    g.w.line(f"mmask = {rows}")
    g.w.line(f"nmask = {cols}")
    g.w.line("omask = mmask & nmask")
    g.axes.update(mmask=X, nmask=R, omask=XR)
    g.narrow["omask"] = {X: "mmask", R: "nmask"}
