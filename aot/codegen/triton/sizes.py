"""Size arithmetic for Triton kernels: hints that stand in for autotuning on a machine without a GPU, the
program-wide index width, and grid sizes in the package's size grammar.

What it is not: a tile chooser; loops.py and the templates pick tiles from these hints.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from aotc.shapes import Size

from ... import kernel as K
from ...symbolic import to_size


def _subs(prog: K.Program, e: sympy.Expr | int, pick: Callable[[int, int | None], int]) -> int | None:
    e = sympy.sympify(e)
    env = {}
    for s in e.free_symbols:
        sym = next((x for x in prog.symbols if x.name == str(s)), None)
        if sym is None:
            return None
        env[s] = pick(sym.min, sym.max)
    try:
        return int(e.subs(env))
    except (TypeError, ValueError):
        return None


def upper(prog: K.Program, e: sympy.Expr | int) -> int | None:
    """An upper bound of a size over the symbols' ranges, or None when a symbol is unbounded."""
    if any(x.max is None for x in prog.symbols if x.name in {str(s) for s in sympy.sympify(e).free_symbols}):
        return None
    return _subs(prog, e, lambda lo, hi: hi if hi is not None else lo)


def hint(prog: K.Program, e: sympy.Expr | int) -> int:
    """A representative value of a size, for choosing tiles."""
    v = _subs(prog, e, lambda lo, hi: max(lo, min(hi if hi is not None else 1024, 1024)))
    return max(1, v if v is not None else 1024)


def example(prog: K.Program, e: sympy.Expr | int) -> int:
    """A size at the example inputs' values of the symbols (``hint`` for a symbol without one): what the
    model was built to run at, so tile configs are chosen (and tuned) for it."""
    e = sympy.sympify(e)
    env = {}
    for s in e.free_symbols:
        sym = next((x for x in prog.symbols if x.name == str(s)), None)
        if sym is None:
            return hint(prog, e)
        env[s] = sym.example if sym.example is not None else hint(prog, s)
    try:
        return max(1, int(e.subs(env)))
    except (TypeError, ValueError):
        return hint(prog, e)


def index_is_i64(prog: K.Program) -> bool:
    """Index math in i64 unless every buffer provably has fewer than 2**31 elements."""
    for b in (*prog.inputs, *prog.outputs, *prog.weights, *prog.arena):
        n = upper(prog, b.numel())
        if n is None or n >= 2**31 - 1:
            return True
    return False


def prod(xs: tuple[sympy.Expr | int, ...]) -> sympy.Expr | int:
    out: sympy.Expr | int = 1
    for x in xs:
        out = out * x
    return out


def cdiv(a: sympy.Expr | int, b: int) -> Size:
    s = to_size(a)
    if isinstance(s, int):
        return -(-s // b)
    return f"CeilDiv({s}, {b})"


def grid_size(e: sympy.Expr | int) -> Size:
    return to_size(e)
