"""The package format: the manifest's dataclasses, its JSON form, and its validation. The one definition.

What it is: ``Manifest`` and the small frozen dataclasses it is made of, ``to_json`` / ``from_json``, and the
checks that make a manifest trustworthy before anything reads a member (every field typed, every size in the
grammar of ``aotc.shapes``, every symbol declared and bindable, every referenced member listed).
What it is not: the container. ``aotc.package`` reads the ZIP and checks hashes; ``aotc_build.package``
writes it. CUDA targets are defined by ``aotc.cuda``: here they are kept as their raw dict
(``CudaTargetRaw``) so this module does not need to know their fields.

A manifest (JSON, keys sorted)::

    {"format": "aotc", "format_version": 1,
     "model": {"name": "mlp", "source_sha256": "…"},
     "build": {"aotc": "0.1.0", "torch": "2.13.0", …},
     "symbols": [{"name": "s0", "label": "batch", "min": 1, "max": 256}],
     "inputs":  [{"name": "x", "dtype": "float32", "shape": ["s0", 256]}],
     "outputs": [{"name": "y", "dtype": "float32", "shape": ["s0", 64]}],
     "weights": {"member": "weights.safetensors", "tensors": [{"name": "fc1.weight", …}]},
     "targets": [{"kind": "cpu", "level": "x86-64-v4", "library": "cpu/x86-64-v4/model.so", …},
                 {"kind": "cuda", "arch": "sm_90", …}],
     "members": {"weights.safetensors": {"sha256": "…", "size": 123}, …},
     "selftest": {"member": "selftest.safetensors", "inputs": […], "outputs": […], "rtol": …, "atol": …}}
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import shapes
from .errors import IncompatiblePackage, PackageCorrupt
from .shapes import Size

FORMAT = "aotc"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20

# Manifest dtype names (the values of aotc_build.ir.DType) and their item sizes.
ITEMSIZE: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
    "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
CPU_LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


@functools.cache
def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a manifest dtype name (little-endian; bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in ITEMSIZE:
        raise KeyError(name)
    return np.dtype(name).newbyteorder("<")


def dtype_name(dt: np.dtype) -> str | None:
    """The manifest name of a numpy dtype, or None when the package format has no such dtype."""
    return _dtype_names().get(np.dtype(dt))


@functools.cache
def _dtype_names() -> dict[np.dtype, str]:
    # a lookup, not == against each name: comparing with ml_dtypes' bfloat16 costs ~0.1 ms a time
    return {numpy_dtype(name): name for name in ITEMSIZE}


# ---- the dataclasses ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    name: str
    source_sha256: str


@dataclass(frozen=True)
class Symbol:
    """A dynamic dimension: its name in size expressions, the user's label and its inclusive range."""

    name: str
    label: str
    min: int
    max: int | None


@dataclass(frozen=True)
class TensorSpec:
    """An input, output or weight: name, manifest dtype name, and sizes (ints or grammar strings)."""

    name: str
    dtype: str
    shape: tuple[Size, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)


@dataclass(frozen=True)
class Weights:
    """The weight blob: one safetensors member; ``tensors`` order is the ABI order."""

    member: str
    tensors: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class CpuTarget:
    """A C++/OpenMP shared library for one x86-64 level; runs where ``features`` are all present."""

    level: str
    features: tuple[str, ...]
    library: str
    abi_version: int
    arena_bytes: Size
    compiler: str
    flags: tuple[str, ...]
    kernels: tuple[str, ...]
    min_glibc: str = ""  # newest GLIBC_x.y symbol version the library needs ("" for none)
    kind: str = "cpu"


@dataclass(frozen=True)
class CudaTargetRaw:
    """A CUDA target as its raw manifest dict; ``aotc.cuda`` gives it meaning. ``raw`` holds every field."""

    kind: str
    arch: str
    raw: Mapping[str, Any]


Target = CpuTarget | CudaTargetRaw


@dataclass(frozen=True)
class Member:
    sha256: str
    size: int


@dataclass(frozen=True)
class SelfTest:
    """Example inputs and eager outputs, by key in a safetensors member, with the comparison tolerances."""

    member: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rtol: float
    atol: float


@dataclass(frozen=True)
class Manifest:
    model: ModelInfo
    build: Mapping[str, str]
    symbols: tuple[Symbol, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weights: Weights
    targets: tuple[Target, ...]
    members: Mapping[str, Member] = field(default_factory=dict)
    selftest: SelfTest | None = None
    format_version: int = FORMAT_VERSION

    @property
    def cpu_targets(self) -> tuple[CpuTarget, ...]:
        return tuple(t for t in self.targets if isinstance(t, CpuTarget))

    @property
    def cuda_targets(self) -> tuple[CudaTargetRaw, ...]:
        return tuple(t for t in self.targets if isinstance(t, CudaTargetRaw))

    def pretty(self, size: Size) -> str:
        """A size with symbol names replaced by the user's labels: ``"2*s0"`` -> ``"2*batch"``."""
        labels = {s.name: s.label for s in self.symbols}
        return re.sub(r"[A-Za-z_]\w*", lambda t: labels.get(t.group(0), t.group(0)), str(size))

    def describe(self, spec: TensorSpec) -> str:
        """``float32[batch, 256]``."""
        return f"{spec.dtype}[{', '.join(self.pretty(d) for d in spec.shape)}]"

    def referenced_members(self) -> list[str]:
        """The members this module knows are needed (CUDA targets may reference more)."""
        out = [self.weights.member, *(t.library for t in self.cpu_targets)]
        if self.selftest is not None:
            out.append(self.selftest.member)
        return out


# ---- to JSON -------------------------------------------------------------------------------------------


def _tensor(t: TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def _target(t: Target) -> dict[str, Any]:
    if isinstance(t, CudaTargetRaw):
        return dict(t.raw)
    return {
        "kind": t.kind, "level": t.level, "features": list(t.features), "library": t.library,
        "abi_version": t.abi_version, "arena_bytes": t.arena_bytes, "compiler": t.compiler,
        "flags": list(t.flags), "kernels": list(t.kernels), "min_glibc": t.min_glibc,
    }  # fmt: skip


def _selftest(st: SelfTest) -> dict[str, Any]:
    return {"member": st.member, "inputs": list(st.inputs), "outputs": list(st.outputs), "rtol": st.rtol, "atol": st.atol}


def to_dict(m: Manifest) -> dict[str, Any]:
    st = m.selftest
    return {
        "format": FORMAT,
        "format_version": m.format_version,
        "model": {"name": m.model.name, "source_sha256": m.model.source_sha256},
        "build": dict(m.build),
        "symbols": [{"name": s.name, "label": s.label, "min": s.min, "max": s.max} for s in m.symbols],
        "inputs": [_tensor(t) for t in m.inputs],
        "outputs": [_tensor(t) for t in m.outputs],
        "weights": {"member": m.weights.member, "tensors": [_tensor(t) for t in m.weights.tensors]},
        "targets": [_target(t) for t in m.targets],
        "members": {p: {"sha256": v.sha256, "size": v.size} for p, v in m.members.items()},
        "selftest": None if st is None else _selftest(st),
    }


def to_json(m: Manifest) -> str:
    """Canonical JSON: sorted keys, so equal manifests give equal bytes."""
    validate(m)
    return json.dumps(to_dict(m), sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


# ---- from JSON: typed field access that names the bad field -----------------------------------------


def _bad(where: str, what: str) -> PackageCorrupt:
    return PackageCorrupt(f"manifest field {where!r}: {what}; the package is damaged or was not written by aotc")


class _Obj:
    """A JSON object being read, with its path for error messages; refuses unknown keys."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise _bad(where, f"expected an object, got {type(value).__name__}")
        self.d: dict[str, Any] = value
        self.where = where
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, *, optional: bool = False) -> Any:
        self.seen.add(key)
        if key not in self.d:
            if optional:
                return None
            raise _bad(self.at(key), "missing")
        return self.d[key]

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise _bad(self.at(key), f"expected a string, got {v!r}")
        return v

    def integer(self, key: str) -> int:
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise _bad(self.at(key), f"expected an integer, got {v!r}")
        return v

    def opt_integer(self, key: str) -> int | None:
        return None if self.get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        v = self.get(key)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise _bad(self.at(key), f"expected a number, got {v!r}")
        return float(v)

    def array(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise _bad(self.at(key), f"expected a list, got {type(v).__name__}")
        return v

    def texts(self, key: str) -> tuple[str, ...]:
        v = self.array(key)
        for i, s in enumerate(v):
            if not isinstance(s, str):
                raise _bad(f"{self.at(key)}[{i}]", f"expected a string, got {s!r}")
        return tuple(v)

    def obj(self, key: str) -> _Obj:
        return _Obj(self.get(key), self.at(key))

    def done(self) -> None:
        extra = sorted(set(self.d) - self.seen)
        if extra:
            raise _bad(self.at(extra[0]), "unknown field (a newer aotc may have written it)")


def _size(v: object, where: str) -> Size:
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            raise _bad(where, f"negative size {v}")
        return v
    if isinstance(v, str):
        try:
            shapes.symbols(v)
        except shapes.ShapeExprError as e:
            raise _bad(where, str(e)) from None
        return v
    raise _bad(where, f"expected an int or a size expression, got {v!r}")


def _tensor_from(v: object, where: str) -> TensorSpec:
    o = _Obj(v, where)
    shape = o.array("shape")
    t = TensorSpec(o.text("name"), o.text("dtype"), tuple(_size(d, f"{o.at('shape')}[{i}]") for i, d in enumerate(shape)))
    o.done()
    return t


def _target_from(v: object, where: str) -> Target:
    o = _Obj(v, where)
    kind = o.text("kind")
    if kind == "cuda":
        return CudaTargetRaw(kind, o.text("arch"), dict(o.d))
    if kind != "cpu":
        raise _bad(o.at("kind"), f"unknown target kind {kind!r} (known: cpu, cuda)")
    t = CpuTarget(
        level=o.text("level"),
        features=o.texts("features"),
        library=o.text("library"),
        abi_version=o.integer("abi_version"),
        arena_bytes=_size(o.get("arena_bytes"), o.at("arena_bytes")),
        compiler=o.text("compiler"),
        flags=o.texts("flags"),
        kernels=o.texts("kernels"),
        min_glibc=o.get("min_glibc", optional=True) or "",
    )
    if not isinstance(t.min_glibc, str) or (t.min_glibc and not re.fullmatch(r"\d+\.\d+", t.min_glibc)):
        raise _bad(o.at("min_glibc"), f"expected a glibc version like '2.36', got {t.min_glibc!r}")
    o.done()
    return t


def from_dict(d: object) -> Manifest:
    """A validated Manifest from parsed JSON. Format and version are checked first: a package from another
    format version is refused as incompatible before its other fields are read."""
    top = _Obj(d, "")
    fmt = top.get("format", optional=True)
    if fmt != FORMAT:
        raise PackageCorrupt(f"not an aotc package: manifest.json has format={fmt!r}, expected {FORMAT!r}")
    version = top.integer("format_version")
    if version != FORMAT_VERSION:
        from . import __version__

        fix = (
            "upgrade the runtime (pip install -U aotc)"
            if version > FORMAT_VERSION
            else f"rebuild the package with aotc {__version__} (aotc build MODEL.py -o OUT.pkg)"
        )
        raise IncompatiblePackage(
            f"package format version {version}; this runtime (aotc {__version__}) reads format version {FORMAT_VERSION}: {fix}"
        )
    mo = top.obj("model")
    model = ModelInfo(mo.text("name"), mo.text("source_sha256"))
    mo.done()
    bo = top.obj("build")
    build = {k: bo.text(k) for k in sorted(bo.d)}
    syms = []
    for i, v in enumerate(top.array("symbols")):
        so = _Obj(v, f"symbols[{i}]")
        syms.append(Symbol(so.text("name"), so.text("label"), so.integer("min"), so.opt_integer("max")))
        so.done()
    wo = top.obj("weights")
    weights = Weights(
        wo.text("member"),
        tuple(_tensor_from(t, f"weights.tensors[{i}]") for i, t in enumerate(wo.array("tensors"))),
    )
    wo.done()
    members = {}
    mem = top.obj("members")
    for path in sorted(mem.d):
        eo = mem.obj(path)
        members[path] = Member(eo.text("sha256"), eo.integer("size"))
        eo.done()
    st_raw = top.get("selftest")
    selftest = None
    if st_raw is not None:
        so = _Obj(st_raw, "selftest")
        selftest = SelfTest(so.text("member"), so.texts("inputs"), so.texts("outputs"), so.number("rtol"), so.number("atol"))
        so.done()
    m = Manifest(
        model=model,
        build=build,
        symbols=tuple(syms),
        inputs=tuple(_tensor_from(t, f"inputs[{i}]") for i, t in enumerate(top.array("inputs"))),
        outputs=tuple(_tensor_from(t, f"outputs[{i}]") for i, t in enumerate(top.array("outputs"))),
        weights=weights,
        targets=tuple(_target_from(t, f"targets[{i}]") for i, t in enumerate(top.array("targets"))),
        members=members,
        selftest=selftest,
        format_version=version,
    )
    top.done()
    validate(m)
    return m


def from_json(text: str | bytes) -> Manifest:
    if len(text) > MAX_MANIFEST_BYTES:
        raise PackageCorrupt(f"manifest.json is {len(text)} bytes, over the {MAX_MANIFEST_BYTES} byte limit")
    try:
        d = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise PackageCorrupt(f"manifest.json is not valid JSON ({e}); the package is damaged") from None
    return from_dict(d)


# ---- cross-field checks ----------------------------------------------------------------------------------

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_member_name(path: str, where: str = "members") -> None:
    """A member path must be relative, '/'-separated, without '.', '..' or empty parts (no path traversal)."""
    parts = path.split("/")
    if (
        not path
        or len(path) > 512
        or path == MANIFEST
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or not path.isascii()
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise _bad(where, f"unsafe or reserved member path {path!r}")


def _unique(names: Iterable[str], where: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise _bad(where, f"duplicate name {n!r}")
        seen.add(n)


def validate(m: Manifest) -> None:
    """Cross-field checks; raises PackageCorrupt naming the first bad field."""
    if m.format_version != FORMAT_VERSION:
        raise _bad("format_version", f"{m.format_version}, this aotc writes {FORMAT_VERSION}")
    for i, s in enumerate(m.symbols):
        if not _NAME.fullmatch(s.name):
            raise _bad(f"symbols[{i}].name", f"{s.name!r} is not an identifier")
        if s.min < 0 or (s.max is not None and s.max < s.min):
            raise _bad(f"symbols[{i}]", f"bad range [{s.min}, {s.max}]")
    _unique((s.name for s in m.symbols), "symbols")
    declared = {s.name for s in m.symbols}
    _unique((t.name for t in m.inputs), "inputs")
    _unique((t.name for t in m.outputs), "outputs")
    _unique((t.name for t in m.weights.tensors), "weights.tensors")
    groups = (("inputs", m.inputs), ("outputs", m.outputs), ("weights.tensors", m.weights.tensors))
    for group, specs in groups:
        for i, t in enumerate(specs):
            if t.dtype not in ITEMSIZE:
                raise _bad(f"{group}[{i}].dtype", f"unknown dtype {t.dtype!r} (known: {', '.join(ITEMSIZE)})")
            for a, d in enumerate(t.shape):
                _size(d, f"{group}[{i}].shape[{a}]")
                undeclared = shapes.symbols(d) - declared
                if undeclared:
                    raise _bad(f"{group}[{i}].shape[{a}]", f"undeclared symbol {sorted(undeclared)[0]!r}")
            if group == "weights.tensors" and not t.is_static:
                raise _bad(f"{group}[{i}].shape", "weights must have static shapes")
    # The runtime binds each symbol from an input dimension that is exactly that symbol.
    bindable = {d for t in m.inputs for d in t.shape if isinstance(d, str) and d in declared}
    for i, s in enumerate(m.symbols):
        if s.name not in bindable:
            raise _bad(f"symbols[{i}]", f"symbol {s.name!r} ({s.label}) is not a plain dimension of any input")
    check_member_name(m.weights.member, "weights.member")
    for i, tg in enumerate(m.targets):
        if isinstance(tg, CpuTarget):
            if tg.level not in CPU_LEVELS:
                raise _bad(f"targets[{i}].level", f"unknown level {tg.level!r} (known: {', '.join(CPU_LEVELS)})")
            check_member_name(tg.library, f"targets[{i}].library")
            _size(tg.arena_bytes, f"targets[{i}].arena_bytes")
            if shapes.symbols(tg.arena_bytes) - declared:
                raise _bad(f"targets[{i}].arena_bytes", "uses an undeclared symbol")
        elif tg.raw.get("kind") != tg.kind or tg.raw.get("arch") != tg.arch:
            raise _bad(f"targets[{i}]", "raw dict disagrees with kind/arch")
    if m.selftest is not None:
        st = m.selftest
        check_member_name(st.member, "selftest.member")
        if len(st.inputs) != len(m.inputs) or len(st.outputs) != len(m.outputs):
            raise _bad("selftest", "needs one key per input and one per output")
        if not (st.rtol >= 0 and st.atol >= 0):
            raise _bad("selftest", f"bad tolerances rtol={st.rtol} atol={st.atol}")
    for path, mem in m.members.items():
        check_member_name(path, f"members[{path!r}]")
        if not _SHA256.fullmatch(mem.sha256):
            raise _bad(f"members.{path}.sha256", "not a lowercase hex sha256")
        if mem.size < 0:
            raise _bad(f"members.{path}.size", "negative")
    if m.members:
        for path in m.referenced_members():
            if path not in m.members:
                raise _bad("members", f"{path!r} is referenced but not listed")
