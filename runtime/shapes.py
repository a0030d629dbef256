"""Symbolic sizes as the package stores them: small integer expressions over named symbols.

A size in the manifest is either an int or a string such as ``"s0*128"``, ``"Max(s0, 4)"`` or
``"CeilDiv(s0*s1*4, 64)*64"``. The grammar is deliberately tiny (+, -, *, //, %, unary -, Max, Min,
CeilDiv, FloorDiv, Mod) and parsed with ``ast`` against a whitelist: no ``eval`` of package text.
The builder prints sympy expressions into this grammar (``aotc_build.symbolic``); the runtime and the
C++ code generator read it back from here, so there is one definition of what a size means.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping

Size = int | str

_FUNCS = {"Max", "Min", "CeilDiv", "FloorDiv", "Mod"}
# Bounds on package text before it reaches the parser: the builder's longest expressions (arena offsets of
# big models) are a few hundred characters and a dozen levels deep.
MAX_LEN = 4096
MAX_DEPTH = 200


class ShapeExprError(ValueError):
    """A size expression that is not in the package grammar."""


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> ast.expr:
    if len(text) > MAX_LEN:
        raise ShapeExprError(f"size expression of {len(text)} characters {text[:40]!r}…: over the {MAX_LEN} limit")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ShapeExprError(f"size expression {text[:80]!r} does not parse: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError) as e:  # ValueError: a NUL byte
        raise ShapeExprError(f"size expression {text[:40]!r}… cannot be parsed ({type(e).__name__})") from None
    _check(tree, text, 0)
    return tree


def _check(node: ast.AST, text: str, depth: int) -> None:
    if depth > MAX_DEPTH:  # deeper than any size the builder writes; and _eval recurses
        raise ShapeExprError(f"size expression {text[:40]!r}… nests deeper than {MAX_DEPTH} levels")
    depth += 1
    ok = (
        isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)
    ) or isinstance(node, ast.Name)
    if isinstance(node, ast.BinOp) and isinstance(
        node.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv | ast.Mod
    ):
        _check(node.left, text, depth)
        _check(node.right, text, depth)
        ok = True
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _check(node.operand, text, depth)
        ok = True
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        if node.keywords or not node.args:
            raise ShapeExprError(f"size expression {text!r}: bad call to {node.func.id}")
        for a in node.args:
            _check(a, text, depth)
        ok = True
    if not ok:
        raise ShapeExprError(f"size expression {text!r} uses {type(node).__name__}, outside the grammar")


def symbols(size: Size) -> set[str]:
    """Names of the symbols a size depends on."""
    if isinstance(size, int):
        return set()
    return set(_names(size))


@functools.lru_cache(maxsize=4096)
def _names(text: str) -> frozenset[str]:
    # a manifest repeats the same few expressions hundreds of times; walk each once
    return frozenset(n.id for n in ast.walk(_parse(text)) if isinstance(n, ast.Name)) - _FUNCS


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ShapeExprError("division by zero in a size expression")
    return a // b


def _eval(node: ast.expr, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)  # type: ignore[arg-type]
    if isinstance(node, ast.Name):
        try:
            return int(env[node.id])
        except KeyError:
            raise ShapeExprError(f"size symbol {node.id!r} has no value") from None
    if isinstance(node, ast.UnaryOp):
        return -_eval(node.operand, env)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.FloorDiv):
            return _floordiv(a, b)
        return a - b * _floordiv(a, b)
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = [_eval(a, env) for a in node.args]
    fn = node.func.id
    if fn == "Max":
        return max(args)
    if fn == "Min":
        return min(args)
    if fn == "CeilDiv":
        return -_floordiv(-args[0], args[1])
    if fn == "FloorDiv":
        return _floordiv(args[0], args[1])
    return args[0] - args[1] * _floordiv(args[0], args[1])


def evaluate(size: Size, env: Mapping[str, int]) -> int:
    """The value of ``size`` with the symbols bound by ``env``."""
    if isinstance(size, int):
        return size
    return _eval(_parse(size), env)


def render(
    size: str,
    *,
    name: Callable[[str], str],
    div: str,
    minmax: Callable[[str, str, str], str],
    ceildiv: Callable[[str, str], str],
    const: Callable[[int], str] = str,
) -> str:
    """A size expression spelled in another language: the one walk over the grammar, for C and Triton.
    ``div`` spells both FloorDiv and ``//``; ``minmax(fn, a, b)`` gets fn "Max" or "Min"."""

    def emit(n: ast.expr) -> str:
        if isinstance(n, ast.Constant):
            return const(int(n.value))  # type: ignore[arg-type]
        if isinstance(n, ast.Name):
            return name(n.id)
        if isinstance(n, ast.UnaryOp):
            return f"(-{emit(n.operand)})"
        if isinstance(n, ast.BinOp):
            op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: div, ast.Mod: "%"}[type(n.op)]
            return f"({emit(n.left)} {op} {emit(n.right)})"
        assert isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        args = [emit(a) for a in n.args]
        fn = n.func.id
        if fn in ("Max", "Min"):
            out = args[0]
            for a in args[1:]:
                out = minmax(fn, out, a)
            return out
        if fn == "CeilDiv":
            return ceildiv(args[0], args[1])
        if fn == "FloorDiv":
            return f"({args[0]} {div} {args[1]})"
        return f"({args[0]} % {args[1]})"

    return emit(_parse(size))


def _c_int(v: int) -> str:
    return f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)


def to_c(size: Size) -> str:
    """The size as a C expression over int64_t variables named like the symbols.

    Sizes are never negative, so C's truncating ``/`` and ``%`` agree with Python's floor forms;
    Max/Min/CeilDiv map to inline helpers declared in ``aotc_abi.h``.
    """
    if isinstance(size, int):
        return _c_int(size)
    return render(
        size, name=lambda n: n, div="/", const=_c_int,
        minmax=lambda fn, a, b: f"aotc_{fn.lower()}({a}, {b})", ceildiv=lambda a, b: f"aotc_ceildiv({a}, {b})",
    )  # fmt: skip
