"""Loop-level kernels (``kernel.py``) → Triton source, one ``@triton.jit`` function per kernel.

What it is: a printer. Each kernel becomes a module text whose function takes buffer pointers and the shape
symbols it needs as arguments, so one cubin serves every symbol value; the launch grid is a size expression
in the package grammar. ``WRITERS`` maps each kernel class to the function that writes it: loops.py for
Pointwise, Reduce and Scan, one file of templates/ per library kernel (Matmul, Conv, Attention). A new template is one
new file there and one row here. values.py is the value printer they all share.
What it is not: a compiler driver. ``cubin.py`` turns the text into cubins and the manifest's CUDA target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotc.errors import CompileError

from ... import kernel as K
from ...options import BuildOptions
from . import loops
from .configs import Config, Shape
from .sizes import index_is_i64
from .templates import attention, conv, matmul
from .values import Param, TritonKernel

__all__ = ["SHAPES", "WRITERS", "Config", "Param", "Shape", "TritonKernel", "generate", "index_is_i64", "tunable"]

# kernel class → writer(prog, kernel, index_i64, options, sm)
WRITERS: dict[type, Callable[[K.Program, Any, bool, BuildOptions, int], TritonKernel]] = {
    K.Pointwise: loops.pointwise,
    K.Reduce: loops.reduce,
    K.Scan: loops.scan,
    K.Matmul: matmul.matmul,
    K.Conv: conv.conv,
    K.Attention: attention.attention,
}


# kernel class → the problem shape its ``Config`` is chosen for; the writers of these take ``config=``
SHAPES: dict[type, Callable[[K.Program, Any, BuildOptions], Shape]] = {
    K.Matmul: matmul.shape,
    K.Conv: conv.shape,
    K.Attention: attention.shape,
    K.Reduce: loops.reduce_shape,
}


def tunable(prog: K.Program, k: K.Kernel) -> bool:
    """Whether ``--tune`` times configs for ``k``: every dot template, and reductions big enough to matter."""
    if isinstance(k, K.Reduce):
        return loops.worth_tuning(prog, k)
    return type(k) in SHAPES


def generate(
    prog: K.Program, k: K.Kernel, options: BuildOptions, sm: int, index_i64: bool | None = None, config: Config | None = None
) -> TritonKernel:
    """The Triton module for one kernel of ``prog`` (for GPU ``sm``, which only shapes tile choice).
    ``index_i64``: ``index_is_i64(prog)``, which callers generating every kernel compute once.
    ``config``: the tile config for a kernel kind in ``SHAPES`` (None: ``configs.choose`` picks)."""
    write = WRITERS.get(type(k))
    if write is None:
        raise CompileError(f"kernel {getattr(k, 'name', k)!r}: unknown kernel type {type(k).__name__}")
    i64 = index_is_i64(prog) if index_i64 is None else index_i64
    try:
        if config is not None:
            if type(k) not in SHAPES:
                raise CompileError(f"kernel {k.name!r}: a {type(k).__name__} takes no tile config")
            return write(prog, k, i64, options, sm, config=config)  # type: ignore[call-arg]
        return write(prog, k, i64, options, sm)
    except (KeyError, ValueError) as e:
        raise CompileError(f"Triton codegen for kernel {k.name!r} failed: {e}") from e
