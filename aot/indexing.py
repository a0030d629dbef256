"""Index math over symbolic shapes: row-major strides, views without copies, and the floor/mod arithmetic
that keeps split/merge reshapes affine. Fusion folds views into loads with it.

What it is: pure functions of sympy expressions and shapes (cached where fusion calls them in loops).
What it is not: a simplifier of arbitrary expressions; anything it cannot keep linear stays a sympy
``floor``/``Mod`` for codegen to print.
"""

from __future__ import annotations

import functools

import sympy

from .ir import Dim, dims_equal

Idx = tuple[sympy.Expr, ...]


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[sympy.Expr, ...]:
    out: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def flat_index(idx: Idx, shape: tuple[Dim, ...]) -> sympy.Expr:
    return sympy.Add(*(i * s for i, s in zip(idx, contiguous_strides(shape), strict=True)))


def is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


@functools.lru_cache(maxsize=65536)
def _groups(src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of non-unit dims of ``src`` and ``dst`` whose sizes multiply to the same value."""
    old = [k for k, d in enumerate(src) if not is_one(d)]
    new = [k for k, d in enumerate(dst) if not is_one(d)]
    out: list[tuple[list[int], list[int]]] = []
    oi = ti = 0
    while oi < len(old) and ti < len(new):
        og, ng = [old[oi]], [new[ti]]
        op, np_ = src[old[oi]], dst[new[ti]]
        oi, ti = oi + 1, ti + 1
        while not dims_equal(op, np_):
            if _num(op) < _num(np_):
                if oi >= len(old):
                    return None
                og.append(old[oi])
                op = op * src[old[oi]]
                oi += 1
            else:
                if ti >= len(new):
                    return None
                ng.append(new[ti])
                np_ = np_ * dst[new[ti]]
                ti += 1
        out.append((og, ng))
    if oi != len(old) or ti != len(new):
        return None
    return out


def view_strides(shape: tuple[Dim, ...], strides: tuple[sympy.Expr, ...], new: tuple[Dim, ...]) -> tuple | None:
    """Strides that view ``shape``/``strides`` as ``new`` without a copy, or None (torch's computeStride)."""
    groups = _groups(shape, new)
    if groups is None:
        return None
    out: list[sympy.Expr] = [sympy.Integer(0)] * len(new)
    for og, ng in groups:
        for a, b in zip(og, og[1:], strict=False):
            if not dims_equal(strides[a], strides[b] * shape[b]):
                return None
        acc = strides[og[-1]]
        for k in reversed(ng):
            out[k] = acc
            acc = acc * new[k]
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _num(d: Dim) -> float:
    """A size to compare magnitudes when growing view groups; symbols count as large."""
    if isinstance(d, int):
        return d
    return float(sympy.sympify(d).subs(dict.fromkeys(sympy.sympify(d).free_symbols, 10 ** 6)))


# ---- index arithmetic that keeps split/merge reshapes affine ------------------------------------------


def _bound(e: sympy.Expr, ranges: dict[sympy.Symbol, Dim]) -> int | None:
    """An upper bound on a nonnegative linear index expression, or None when unknown."""
    total = 0
    for term, coeff in e.as_coefficients_dict().items():
        if term == 1:
            total += int(coeff)
            continue
        if not (coeff.is_Integer and int(coeff) >= 0 and term in ranges and isinstance(ranges[term], int)):
            return None
        total += int(coeff) * (int(ranges[term]) - 1)
    return total


def _exact_quotient(c: sympy.Expr, p: Dim) -> sympy.Expr | None:
    if isinstance(p, int):
        coeff, rest = c.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % p == 0:
            return (int(coeff) // p) * rest
        return None
    q = sympy.cancel(c / p)
    num, den = sympy.fraction(q)
    return q if den == 1 and all(t.is_Integer for t in sympy.Poly(num).coeffs()) else None


def fdiv(e: sympy.Expr, p: Dim, ranges: dict[sympy.Symbol, Dim]) -> sympy.Expr:
    """floor(e / p), kept linear when the terms that do not divide by p sum to less than p."""
    if is_one(p):
        return e
    q, r = sympy.Integer(0), sympy.Integer(0)
    for term, coeff in e.as_coefficients_dict().items():
        part = _exact_quotient(coeff * term, p)
        if part is None:
            r += coeff * term
        else:
            q += part
    if r == 0:
        return q
    b = _bound(r, ranges)
    if b is not None and isinstance(p, int) and b < p:
        return q
    return sympy.floor(e / p)


def fmod(e: sympy.Expr, m: Dim, ranges: dict[sympy.Symbol, Dim]) -> sympy.Expr:
    """e mod m, dropping terms that are multiples of m and the mod itself when e < m always."""
    if is_one(m):
        return sympy.Integer(0)
    keep = sympy.Integer(0)
    for term, coeff in e.as_coefficients_dict().items():
        if _exact_quotient(coeff * term, m) is None:
            keep += coeff * term
    b = _bound(keep, ranges)
    if b is not None and isinstance(m, int) and b < m:
        return keep
    if isinstance(keep, sympy.Symbol) and keep in ranges and dims_equal(ranges[keep], m):
        return keep
    return sympy.Mod(keep, m)


def reshape_index(idx: Idx, src: tuple[Dim, ...], dst: tuple[Dim, ...], ranges: dict) -> Idx:
    """Indices into ``src`` for position ``idx`` of its reshape to ``dst`` (row-major)."""
    groups = _groups(src, dst)
    if groups is None:
        groups = [([k for k in range(len(src)) if not is_one(src[k])], [k for k in range(len(dst)) if not is_one(dst[k])])]
    out: list[sympy.Expr] = [sympy.Integer(0)] * len(src)
    for og, ng in groups:
        flat: sympy.Expr = sympy.Integer(0)
        for k in ng:
            flat = flat * dst[k] + idx[k]
        inner: Dim = 1
        for j, k in enumerate(reversed(og)):
            q = fdiv(flat, inner, ranges)
            out[k] = q if j == len(og) - 1 else fmod(q, src[k], ranges)
            inner = inner * src[k]
    return tuple(out)
