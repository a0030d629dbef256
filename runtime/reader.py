"""Reading JSON into frozen dataclasses, driven by their fields; and the plain JSON form of those dataclasses.

What it is: ``read(cls, value, where)`` walks ``dataclasses.fields(cls)`` with their resolved type hints and
builds the dataclass, refusing with ``PackageCorrupt`` (naming the field's path, e.g.
``targets[1].kernels[0].params[2].bytes``) anything of the wrong type, any missing field without a default,
and any unknown field. ``plain(obj)`` is the inverse: dataclasses to dicts, tuples to lists.
What it is not: the package format. ``aotc.schema`` defines the dataclasses and the cross-field checks.

Types understood: str, int, float, bool, None-able fields, ``tuple[X, ...]`` and fixed tuples,
``Mapping[str, X]``, ``Literal[...]``, nested dataclasses, unions of plain scalars (kept as JSON gave
them), unions of dataclasses told apart by their ``kind`` field, and ``Size`` (``int | str``: a
non-negative int or a size expression in the grammar of ``aotc.shapes``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from . import shapes
from .errors import PackageCorrupt

T = TypeVar("T")
_NONE = type(None)
_SIZE = frozenset({int, str})


def bad(where: str, what: str) -> PackageCorrupt:
    return PackageCorrupt(f"manifest field {where!r}: {what}; the package is damaged or was not written by aotc")


def read(cls: type[T], value: object, where: str = "") -> T:
    """``value`` (parsed JSON) as a ``cls``; ``where`` is its path, for error messages."""
    return typing.cast(T, _value(cls, value, where))


def plain(obj: object) -> Any:
    """The JSON form of a dataclass tree: every field, tuples as lists, mappings as dicts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def field_types(cls: type) -> dict[str, Any]:
    """What ``typing.get_type_hints`` gives for a dataclass's fields, by one ``eval`` of each annotation in its
    class's module: get_type_hints wraps each string in a ForwardRef and walks it (~5 ms of a cold start for
    the manifest's records; tests/test_hashing.py checks the two agree for every record of the format)."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        names = vars(klass).get("__annotations__", {})
        env = vars(sys.modules[klass.__module__])
        for name, ann in names.items():
            out[name] = eval(ann, env) if isinstance(ann, str) else ann  # source text of aotc classes, not package data
    return out


@functools.cache
def _fields(cls: type) -> tuple[tuple[tuple[str, Any, bool], ...], frozenset[str]]:
    """Each field's (name, resolved type, required), and the set of names: worked out once per class."""
    hints = field_types(cls)
    fs = tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )
    return fs, frozenset(name for name, _, _ in fs)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object(cls: type, value: object, where: str) -> Any:
    if not isinstance(value, dict):
        raise bad(where, f"expected an object, got {type(value).__name__}")
    fs, names = _fields(cls)
    kwargs = {}
    for name, hint, required in fs:
        if name not in value:
            if required:
                raise bad(_at(where, name), "missing")
            continue
        kwargs[name] = _value(hint, value[name], _at(where, name))
    unknown = sorted(set(value) - names)
    if unknown:
        raise bad(_at(where, str(unknown[0])), "unknown field (a newer aotc may have written it)")
    return cls(**kwargs)


def _kind(cls: type) -> object:
    f = next((f for f in dataclasses.fields(cls) if f.name == "kind"), None)
    return None if f is None else f.default


@functools.cache
def _members(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool, dict[object, type] | None]:
    """A union's members other than None, whether it is ``Size``, and its classes by ``kind`` when every
    member is a dataclass."""
    rest = tuple(a for a in args if a is not _NONE)
    kinds = {_kind(a): a for a in rest} if all(dataclasses.is_dataclass(a) for a in rest) else None
    return rest, set(rest) == _SIZE, kinds


def _union(args: tuple[Any, ...], value: object, where: str) -> Any:
    if value is None and _NONE in args:
        return None
    rest, is_size, kinds = _members(args)
    if is_size:
        return size(value, where)
    if kinds is not None:
        kind = value.get("kind") if isinstance(value, dict) else None
        if not isinstance(kind, str | None) or kind not in kinds:
            known = ", ".join(str(k) for k in kinds)
            raise bad(_at(where, "kind"), f"unknown kind {kind!r} (known: {known})")
        return _object(kinds[kind], value, where)
    for a in rest:  # plain scalars: keep the type JSON gave (2 stays an int, 2.5 a float)
        if a in (bool, int, float, str) and _is(a, value):
            return value
    names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
    raise bad(where, f"expected {names}, got {value!r:.60}")


def _is(t: type, value: object) -> bool:
    if t is bool:
        return isinstance(value, bool)
    if t is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, t) and not isinstance(value, bool)


MAX_SIZE = 1 << 62  # no buffer, offset or dimension of a real model comes near; int64 math in C stays exact


def size(value: object, where: str) -> shapes.Size:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise bad(where, f"negative size {value}")
        if value > MAX_SIZE:
            raise bad(where, f"size {value} is over the 2**62 limit")
        return value
    if isinstance(value, str):
        try:
            shapes.symbols(value)
        except shapes.ShapeExprError as e:
            raise bad(where, str(e)) from None
        return value
    raise bad(where, f"expected an int or a size expression, got {value!r:.60}")


@functools.cache
def _parts(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return get_origin(hint), get_args(hint)


def _value(hint: Any, value: object, where: str) -> Any:
    origin, args = _parts(hint)
    if origin in (Union, types.UnionType):
        return _union(args, value, where)
    if origin is Literal:
        if value not in args:
            raise bad(where, f"expected one of {', '.join(map(repr, args))}, got {value!r:.60}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise bad(where, f"expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise bad(where, f"expected {len(args)} entries, got {len(value)}")
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (Mapping, dict):
        if not isinstance(value, dict):
            raise bad(where, f"expected an object, got {type(value).__name__}")
        return {k: _value(args[1], value[k], _at(where, k)) for k in sorted(value)}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _object(hint, value, where)
    if hint in (bool, int, float, str):
        if not _is(hint, value):
            raise bad(where, f"expected {'a number' if hint is float else hint.__name__}, got {value!r:.60}")
        return float(value) if hint is float else value  # type: ignore[arg-type]
    raise TypeError(f"aotc.reader cannot read a {hint!r} ({where})")  # a schema bug, not a bad package
