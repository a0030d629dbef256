"""aotc.records: the schema's frozen dataclasses behave like ``dataclasses.dataclass(frozen=True)``."""

from __future__ import annotations

import dataclasses
import math

import pytest
from aotc.records import dataclass
from aotc.schema import Manifest, Member, Symbol, TensorSpec


@dataclass(frozen=True)
class Rec:
    a: int
    b: str = "x"
    c: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Ref:
    a: int
    b: str = "x"
    c: dict = dataclasses.field(default_factory=dict)


def test_same_behaviour_as_dataclasses() -> None:
    for cls in (Rec, Ref):
        r = cls(1)
        assert (r.a, r.b, r.c) == (1, "x", {})
        assert cls(1).c is not cls(1).c  # a fresh default per instance
        assert cls(1, "y", {"k": 1}) == cls(a=1, b="y", c={"k": 1}) != cls(2)
        assert repr(cls(1, "y")) == f"{cls.__qualname__}(a=1, b='y', c={{}})"
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.a = 2  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            del r.b  # type: ignore[misc]
        with pytest.raises(TypeError):
            cls()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cls(1, nope=2)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            hash(cls(1))  # a dict field: unhashable, as with dataclasses
        assert dataclasses.replace(cls(1), b="z") == cls(1, "z")
        assert dataclasses.asdict(cls(1)) == {"a": 1, "b": "x", "c": {}}
        assert [f.name for f in dataclasses.fields(cls)] == ["a", "b", "c"]
        assert cls(1).__eq__(object()) is NotImplemented


def test_schema_records() -> None:
    s = Symbol("s0", "batch", 1, 8)
    assert hash(s) == hash(Symbol("s0", "batch", 1, 8)) and s == Symbol("s0", "batch", 1, 8)
    assert {s: 1}[Symbol("s0", "batch", 1, 8)] == 1
    nan = (math.nan,)
    assert TensorSpec("x", "float32", nan) == TensorSpec("x", "float32", nan)  # type: ignore[arg-type]  # identity first, like dataclasses
    assert Member("0" * 64, 3) != Member("0" * 64, 4)
    assert dataclasses.is_dataclass(Manifest) and Manifest.__doc__
