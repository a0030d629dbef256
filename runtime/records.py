"""``dataclass(frozen=True)`` for the package format's records, without compiling methods at import.

What it is: the decorator ``aotc.schema`` applies to its records. The class it returns is a real dataclass
(``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work) with the methods
``dataclasses.dataclass(frozen=True)`` would give it: ``__init__`` (positional or by name, defaults and
default factories), ``__repr__``, ``__eq__``, ``__hash__`` over the fields, and assignment refused with
``dataclasses.FrozenInstanceError``.
What it is not: a general replacement: no ``order``, ``slots``, ``kw_only``, ``InitVar`` or
``__post_init__`` (the schema uses none); type checkers see ``dataclasses.dataclass`` itself.

Note (why): ``dataclasses`` compiles six methods per class from source text; the schema's 16 records took
~40 ms of ``import aotc`` on a loaded 2-core machine, a third of the import and a sixth of a cold start.
Here ``__repr__``, ``__eq__``, ``__hash__`` and the frozen ``__setattr__``/``__delattr__`` are shared
functions that read the field list, and ``__init__`` is compiled the first time the class is
instantiated: a CPU load never builds the CUDA records, and instances are made at compiled speed after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_FACTORY = object()  # the default of a parameter whose field has a default_factory


def dataclass(*, frozen: bool) -> Callable[[type[T]], type[T]]:
    if not frozen:
        raise TypeError("aotc.records makes frozen dataclasses only")
    return _frozen


def _frozen(cls: type[T]) -> type[T]:
    if cls.__doc__ is None:  # dataclasses would build it with inspect.signature (a slow import)
        cls.__doc__ = cls.__name__
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)  # fields only: nothing compiled
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = tuple(f.name for f in fields)
    compared = tuple(f.name for f in fields if f.compare)
    hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls, fields)
        type.__setattr__(cls, "__init__", init)
        init(self, *args, **kwargs)

    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in hashed))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    for fn in (__init__, __repr__, __eq__, __hash__, __setattr__, __delattr__):
        fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
        type.__setattr__(cls, fn.__name__, fn)
    return cls


def _compile_init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """The ``__init__`` dataclasses would compile for a frozen class (values set with object.__setattr__)."""
    env: dict[str, Any] = {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    params, body = ["self"], []
    for i, f in enumerate(fields):
        if f.default is not dataclasses.MISSING:
            env[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f{i}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _f{i}()")
        else:
            params.append(f.name)
        body.append(f"    _set(self, {f.name!r}, {f.name})")
    src = f"def __init__({', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(src, env)  # the text is built from field names only, which Python already accepted as identifiers
    init: Callable[..., None] = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init
