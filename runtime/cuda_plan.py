"""The CUDA target of a package manifest: its dict format, typed form, and validation.

What it is: the one definition of a ``{"kind": "cuda", ...}`` entry of the manifest's ``targets`` list.
The builder (``aotc_build.cubin``) builds a ``CudaTarget`` and writes ``to_dict()``; the runtime parses the
raw dict with ``parse()``, which refuses anything malformed with ``PackageCorrupt`` before a byte of code
reaches the driver. What it is not: the driver binding (``cuda.py``) or the package reader.

Format (``format`` 1)::

    {"kind": "cuda", "format": 1, "arch": "sm_90", "triton_version": "3.9.0", "ptxas_version": "13.4",
     "min_driver": 13000,                      # cuDriverGetVersion() value the cubins need
     "precision": "fp32",
     "symbols": ["s0"],                        # names the size expressions use
     "inputs":  [{"name": "x", "dtype": "float32", "shape": ["s0", 1024]}],   # also "outputs", "weights"
     "arena_bytes": "(4096*s0)", "arena": {"buf3": 0, "buf5": "(2048*s0)"},  # byte offsets
     "kernels": [{"name": "k0", "member": "cuda/sm_90/k0.cubin", "source": "cuda/sm_90/k0.py",
                  "params": [{"kind": "ptr", "bytes": 8}, {"kind": "i32", "bytes": 4},
                             {"kind": "global_scratch", "bytes": 8}, {"kind": "profile_scratch", "bytes": 8}],
                  "num_warps": 4, "num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 0,
                  "global_scratch_size": 0, "global_scratch_align": 1,
                  "profile_scratch_size": 0, "profile_scratch_align": 1,
                  "launch_cooperative_grid": false, "launch_pdl": false,
                  "enable_fp_fusion": true, "ptxas_version": "13.4"}],
     "launches": [{"kernel": "k0", "grid": ["CeilDiv(s0, 1)", 1, 1],
                   "args": [{"kind": "ptr", "buffer": "x"}, {"kind": "i32", "expr": "s0"},
                            {"kind": "f32", "value": 2.5}]}]}

``params`` are read from the compiled PTX ``.entry`` signature: the launch arguments first, then the
scratch pointers Triton appends (``global_scratch`` since 3.3, ``profile_scratch`` since 3.5), which the
runtime passes as device pointers, or 0 when their size is 0. Scalars are packed at ``bytes`` wide
(fp32 as 4 bytes, fp16/bf16 as their 2-byte bit pattern).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import shapes
from .errors import PackageCorrupt
from .schema import ITEMSIZE
from .shapes import Size

FORMAT = 1
SCALAR_BYTES = {
    "i1": 1,
    "i8": 1,
    "u8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
}
PARAM_BYTES = {"ptr": 8, **SCALAR_BYTES, "global_scratch": 8, "profile_scratch": 8}
DTYPES = tuple(ITEMSIZE)  # the manifest's dtype names: one table, in aotc.schema
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMBER = re.compile(r"^cuda/sm_[0-9]+a?/[A-Za-z_][A-Za-z0-9_]*\.(cubin|py)$")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # the manifest dtype name ("float32", "bfloat16", ...)
    shape: tuple[Size, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Kernel:
    """One cubin: a compiled Triton function and what launching it needs."""

    name: str  # the function's name inside the cubin
    member: str  # package member holding the cubin
    params: tuple[tuple[str, int], ...]  # (kind, bytes) of every PTX parameter, scratch ones last
    num_warps: int
    shared: int  # dynamic shared memory bytes
    num_ctas: int = 1
    cluster_dims: tuple[int, int, int] = (1, 1, 1)
    global_scratch_size: int = 0
    global_scratch_align: int = 1
    profile_scratch_size: int = 0
    profile_scratch_align: int = 1
    launch_cooperative_grid: bool = False
    launch_pdl: bool = False
    enable_fp_fusion: bool = True
    ptxas_version: str = ""
    source: str | None = None  # package member holding the Triton source (for inspection only)

    @property
    def num_args(self) -> int:
        return sum(1 for k, _ in self.params if k not in ("global_scratch", "profile_scratch"))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name, "member": self.member,
            "params": [{"kind": k, "bytes": b} for k, b in self.params],
            "num_warps": self.num_warps, "num_ctas": self.num_ctas, "cluster_dims": list(self.cluster_dims),
            "shared": self.shared,
            "global_scratch_size": self.global_scratch_size,
            "global_scratch_align": self.global_scratch_align,
            "profile_scratch_size": self.profile_scratch_size,
            "profile_scratch_align": self.profile_scratch_align,
            "launch_cooperative_grid": self.launch_cooperative_grid, "launch_pdl": self.launch_pdl,
            "enable_fp_fusion": self.enable_fp_fusion, "ptxas_version": self.ptxas_version,
        }  # fmt: skip
        if self.source is not None:
            d["source"] = self.source
        return d


@dataclass(frozen=True)
class Arg:
    """A launch argument: a buffer's device pointer, a size expression, or a literal scalar."""

    kind: str  # "ptr" or a scalar kind of SCALAR_BYTES
    buffer: str | None = None
    expr: Size | None = None
    value: float | int | bool | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.buffer is not None:
            d["buffer"] = self.buffer
        elif self.expr is not None:
            d["expr"] = self.expr
        else:
            d["value"] = self.value
        return d


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[Size, Size, Size]
    args: tuple[Arg, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": list(self.grid), "args": [a.to_dict() for a in self.args]}


@dataclass(frozen=True)
class CudaTarget:
    arch: str  # "sm_90"
    triton_version: str
    ptxas_version: str
    min_driver: int
    symbols: tuple[str, ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weights: tuple[Tensor, ...]
    arena_bytes: Size
    arena: tuple[tuple[str, Size], ...]  # arena buffer → byte offset
    kernels: tuple[Kernel, ...]
    launches: tuple[Launch, ...]
    precision: str = "fp32"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sm(self) -> int:
        return int(self.arch.removeprefix("sm_").rstrip("a"))

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "cuda", "format": FORMAT, "arch": self.arch, "triton_version": self.triton_version,
            "ptxas_version": self.ptxas_version, "min_driver": self.min_driver, "precision": self.precision,
            "symbols": list(self.symbols),
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "weights": [t.to_dict() for t in self.weights],
            "arena_bytes": self.arena_bytes, "arena": dict(self.arena),
            "kernels": [k.to_dict() for k in self.kernels], "launches": [x.to_dict() for x in self.launches],
            **self.extra,
        }  # fmt: skip


# ---- parsing ---------------------------------------------------------------------------------------


class _Reader:
    """Typed field access that names the path of whatever is malformed."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, what: str) -> PackageCorrupt:
        return PackageCorrupt(f"{self.where}: {path}: {what}; rebuild the package with `aotc build`")

    def get(self, d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], path: str, default: Any = ...) -> Any:
        if not isinstance(d, Mapping):
            raise self.fail(path, f"expected an object, got {type(d).__name__}")
        if key not in d:
            if default is not ...:
                return default
            raise self.fail(f"{path}.{key}", "missing")
        v = d[key]
        bad_bool = isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))
        if not isinstance(v, typ) or bad_bool:
            raise self.fail(f"{path}.{key}", f"expected {_tname(typ)}, got {type(v).__name__} {v!r:.60}")
        return v

    def size(self, v: Any, path: str, symbols: tuple[str, ...]) -> Size:
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise self.fail(path, f"expected a size (int or expression), got {v!r:.60}")
        try:
            used = shapes.symbols(v)
        except shapes.ShapeExprError as e:
            raise self.fail(path, str(e)) from None
        unknown = used - set(symbols)
        if unknown:
            raise self.fail(path, f"size {v!r} uses unknown symbols {sorted(unknown)}")
        return v

    def count(self, d: Mapping[str, Any], key: str, path: str, default: Any = ..., lo: int = 0) -> int:
        v = self.get(d, key, int, path, default)
        if v < lo:
            raise self.fail(f"{path}.{key}", f"must be >= {lo}, got {v}")
        return int(v)


def _tname(t: type | tuple[type, ...]) -> str:
    return " or ".join(x.__name__ for x in t) if isinstance(t, tuple) else t.__name__


def parse(raw: Mapping[str, Any], where: str = "manifest cuda target") -> CudaTarget:
    """The typed form of one ``kind: "cuda"`` manifest entry; ``PackageCorrupt`` on anything malformed."""
    r = _Reader(where)
    if r.get(raw, "kind", str, "target") != "cuda":
        raise r.fail("target.kind", "is not 'cuda'")
    fmt = r.get(raw, "format", int, "target")
    if fmt != FORMAT:
        raise r.fail("target.format", f"CUDA target format {fmt} is not {FORMAT}, the one this runtime reads")
    arch = r.get(raw, "arch", str, "target")
    if not re.fullmatch(r"sm_[0-9]+a?", arch):
        raise r.fail("target.arch", f"{arch!r} is not of the form sm_NN")
    symbols = tuple(r.get(raw, "symbols", list, "target"))
    for i, s in enumerate(symbols):
        if not isinstance(s, str) or not _NAME.match(s):
            raise r.fail(f"target.symbols[{i}]", f"{s!r} is not a symbol name")

    def tensors(key: str) -> tuple[Tensor, ...]:
        out = []
        for i, t in enumerate(r.get(raw, key, list, "target")):
            p = f"target.{key}[{i}]"
            dt = r.get(t, "dtype", str, p)
            if dt not in DTYPES:
                raise r.fail(f"{p}.dtype", f"unknown dtype {dt!r}")
            shape = tuple(r.size(s, f"{p}.shape[{j}]", symbols) for j, s in enumerate(r.get(t, "shape", list, p)))
            out.append(Tensor(r.get(t, "name", str, p), dt, shape))
        return tuple(out)

    inputs, outputs, weights = tensors("inputs"), tensors("outputs"), tensors("weights")
    arena_raw = r.get(raw, "arena", dict, "target")
    arena = tuple((str(k), r.size(v, f"target.arena.{k}", symbols)) for k, v in sorted(arena_raw.items()))
    buffers = [t.name for t in (*inputs, *outputs, *weights)] + [k for k, _ in arena]
    if len(set(buffers)) != len(buffers):
        raise r.fail("target", "buffer names repeat across inputs/outputs/weights/arena")
    kernels = []
    for i, k in enumerate(r.get(raw, "kernels", list, "target")):
        p = f"target.kernels[{i}]"
        name = r.get(k, "name", str, p)
        if not _NAME.match(name):
            raise r.fail(f"{p}.name", f"{name!r} is not a kernel name")
        member = r.get(k, "member", str, p)
        if not _MEMBER.match(member) or not member.endswith(".cubin"):
            raise r.fail(f"{p}.member", f"{member!r} is not a cuda/sm_NN/<name>.cubin member")
        params = []
        for j, q in enumerate(r.get(k, "params", list, p)):
            kind = r.get(q, "kind", str, f"{p}.params[{j}]")
            nbytes = r.get(q, "bytes", int, f"{p}.params[{j}]")
            if kind not in PARAM_BYTES or PARAM_BYTES[kind] != nbytes:
                raise r.fail(f"{p}.params[{j}]", f"kind {kind!r} with {nbytes} bytes is not a known parameter")
            params.append((kind, nbytes))
        cd = r.get(k, "cluster_dims", list, p, [1, 1, 1])
        if len(cd) != 3 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in cd):
            raise r.fail(f"{p}.cluster_dims", f"expected three positive ints, got {cd!r}")
        src = r.get(k, "source", str, p, None)
        kernels.append(
            Kernel(
                name=name,
                member=member,
                params=tuple(params),
                num_warps=r.count(k, "num_warps", p, lo=1),
                shared=r.count(k, "shared", p),
                num_ctas=r.count(k, "num_ctas", p, 1, lo=1),
                cluster_dims=(cd[0], cd[1], cd[2]),
                global_scratch_size=r.count(k, "global_scratch_size", p, 0),
                global_scratch_align=r.count(k, "global_scratch_align", p, 1, lo=1),
                profile_scratch_size=r.count(k, "profile_scratch_size", p, 0),
                profile_scratch_align=r.count(k, "profile_scratch_align", p, 1, lo=1),
                launch_cooperative_grid=r.get(k, "launch_cooperative_grid", bool, p, False),
                launch_pdl=r.get(k, "launch_pdl", bool, p, False),
                enable_fp_fusion=r.get(k, "enable_fp_fusion", bool, p, True),
                ptxas_version=r.get(k, "ptxas_version", str, p, ""),
                source=src,
            )
        )
    by_name = {k.name: k for k in kernels}
    if len(by_name) != len(kernels):
        raise r.fail("target.kernels", "kernel names repeat")
    launches = []
    for i, x in enumerate(r.get(raw, "launches", list, "target")):
        p = f"target.launches[{i}]"
        kname = r.get(x, "kernel", str, p)
        if kname not in by_name:
            raise r.fail(f"{p}.kernel", f"names no kernel of this target: {kname!r}")
        kern = by_name[kname]
        grid = r.get(x, "grid", list, p)
        if len(grid) != 3:
            raise r.fail(f"{p}.grid", f"expected 3 sizes, got {len(grid)}")
        gsz = tuple(r.size(g, f"{p}.grid[{j}]", symbols) for j, g in enumerate(grid))
        args = []
        raw_args = r.get(x, "args", list, p)
        if len(raw_args) != kern.num_args:
            raise r.fail(
                f"{p}.args",
                f"{len(raw_args)} arguments for kernel {kname!r}, whose PTX takes {kern.num_args}",
            )
        for j, a in enumerate(raw_args):
            q = f"{p}.args[{j}]"
            kind = r.get(a, "kind", str, q)
            if kind != kern.params[j][0]:
                raise r.fail(f"{q}.kind", f"{kind!r} but the kernel's parameter {j} is {kern.params[j][0]!r}")
            if kind == "ptr":
                buf = r.get(a, "buffer", str, q)
                if buf not in buffers:
                    raise r.fail(f"{q}.buffer", f"names no buffer of this target: {buf!r}")
                args.append(Arg(kind, buffer=buf))
            elif "expr" in a:
                args.append(Arg(kind, expr=r.size(a["expr"], f"{q}.expr", symbols)))
            else:
                v = r.get(a, "value", (int, float, bool), q)
                args.append(Arg(kind, value=v))
        launches.append(Launch(kname, (gsz[0], gsz[1], gsz[2]), tuple(args)))
    known = {
        "kind", "format", "arch", "triton_version", "ptxas_version", "min_driver", "precision", "symbols",
        "inputs", "outputs", "weights", "arena_bytes", "arena", "kernels", "launches",
    }  # fmt: skip
    return CudaTarget(
        arch=arch,
        triton_version=r.get(raw, "triton_version", str, "target"),
        ptxas_version=r.get(raw, "ptxas_version", str, "target"),
        min_driver=r.count(raw, "min_driver", "target"),
        symbols=symbols,
        inputs=inputs,
        outputs=outputs,
        weights=weights,
        arena_bytes=r.size(r.get(raw, "arena_bytes", (int, str), "target"), "target.arena_bytes", symbols),
        arena=arena,
        kernels=tuple(kernels),
        launches=tuple(launches),
        precision=r.get(raw, "precision", str, "target", "fp32"),
        extra={k: v for k, v in raw.items() if k not in known},
    )
