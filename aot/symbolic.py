"""Printing sympy sizes and indices into the package grammar (``aotc.shapes``) and into C.

torch.export hands us sympy expressions built from its own functions (FloorDiv, CeilDiv, Mod, Max ...);
fusion adds ``floor``/``Mod`` from index math. Both print through one function here.
"""

from __future__ import annotations

import sympy
from aotc.shapes import Size

_FLOORDIV_NAMES = {"FloorDiv", "IntTrueDiv"}
_MOD_NAMES = {"Mod", "PythonMod", "ModularIndexing"}


def _p(e: sympy.Basic) -> str:
    name = type(e).__name__
    if e.is_Integer:
        v = int(e)
        return str(v) if v >= 0 else f"(-{-v})"
    if e.is_Symbol:
        return str(e)
    if isinstance(e, sympy.Add):
        terms = sorted(e.args, key=sympy.default_sort_key)
        return "(" + " + ".join(_p(t) for t in terms) + ")"
    if isinstance(e, sympy.Mul):
        coeff, rest = e.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            # a*b/q: only exact when q divides; indices never need this, so refuse loudly
            num, den = coeff.p, coeff.q
            return f"FloorDiv({_p(num * rest)}, {den})"
        factors = sorted(e.args, key=sympy.default_sort_key)
        return "(" + "*".join(_p(f) for f in factors) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + "*".join([_p(e.base)] * int(e.exp)) + ")"
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"FloorDiv({_p(num)}, {_p(den)})"
    if isinstance(e, sympy.ceiling):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"CeilDiv({_p(num)}, {_p(den)})"
    if name in _FLOORDIV_NAMES:
        return f"FloorDiv({_p(e.args[0])}, {_p(e.args[1])})"
    if name == "CeilDiv":
        return f"CeilDiv({_p(e.args[0])}, {_p(e.args[1])})"
    if name == "ModularIndexing":  # (x // d) % m
        x, d, m = e.args
        return f"Mod(FloorDiv({_p(x)}, {_p(d)}), {_p(m)})"
    if name in _MOD_NAMES:
        return f"Mod({_p(e.args[0])}, {_p(e.args[1])})"
    if isinstance(e, sympy.Max) or name == "Max":
        return "Max(" + ", ".join(_p(a) for a in e.args) + ")"
    if isinstance(e, sympy.Min) or name == "Min":
        return "Min(" + ", ".join(_p(a) for a in e.args) + ")"
    raise ValueError(f"cannot print size expression {e!r} ({name}) into the package grammar")


def to_size(e: sympy.Expr | int) -> Size:
    """A size for the manifest: an int when concrete, else a grammar string."""
    if isinstance(e, int):
        return e
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    return _p(e)


def to_c(e: sympy.Expr | int) -> str:
    """A C expression (int64_t arithmetic) for a size or index."""
    from aotc.shapes import to_c as grammar_to_c

    return grammar_to_c(to_size(e))
