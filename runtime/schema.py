"""The package format: the manifest's dataclasses (defined in ``aotc.manifest``, re-exported here), its JSON
form, and its validation. Import the format from here.

What it is: ``to_json`` / ``from_json`` of ``Manifest`` and the small frozen dataclasses it is made of (CPU
and CUDA targets included; docs/format.md describes each field), and the checks that make a manifest
trustworthy before anything reads a member
(every field typed, every size in the grammar of ``aotc.shapes``, every symbol declared and bindable, every
launch argument matching its kernel's parameters, every referenced member listed). Fields are read by
``aotc.reader``, driven by the dataclasses of ``aotc.manifest``, which refuses unknown fields.
What it is not: the container. ``aotc.package`` reads the ZIP and checks hashes; ``aotc_build.package``
writes it.

A manifest (JSON, keys sorted)::

    {"format": "aotc", "format_version": 5,
     "model": {"name": "mlp", "source_sha256": "…", "frontend": "torch.export"},
     "build": {"aotc": "0.1.0", "torch": "2.13.0", …},
     "symbols": [{"name": "s0", "label": "batch", "min": 1, "max": 256}],
     "inputs":  [{"name": "x", "dtype": "float32", "shape": ["s0", 256]}],
     "outputs": [{"name": "y", "dtype": "float32", "shape": ["s0", 64]}],
     "weights": {"member": "weights.safetensors", "tensors": [{"name": "fc1.weight", …}]},
     "targets": [{"kind": "cpu", "level": "x86-64-v4", "library": "cpu/x86-64-v4/model.so",
                  "packed": {"member": "cpu/x86-64-v4/packed.safetensors", "tensors": […]}, …},
                 {"kind": "cuda", "arch": "sm_90", "kernels": […], "launches": […], …}],
     "members": {"weights.safetensors": {"sha256": "…", "size": 123, "chunks": []}, …},
     "selftest": {"member": "selftest.safetensors", "inputs": […], "outputs": […], "rtol": …, "atol": …}}

A CUDA target holds only what is its own; inputs, outputs, weights and symbols are the manifest's::

    {"kind": "cuda", "arch": "sm_90", "triton_version": "3.9.0", "ptxas_version": "13.4",
     "min_driver": 13000, "precision": "fp32",
     "arena_bytes": "(4096*s0)", "arena": [{"name": "buf3", "offset": 0}, …],
     "kernels": [{"name": "k0", "member": "cuda/sm_90/k0.cubin", "source": "cuda/sm_90/k0.py",
                  "params": [{"kind": "ptr", "bytes": 8}, …, {"kind": "global_scratch", "bytes": 8}],
                  "num_warps": 4, "num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 0, …}],
     "launches": [{"kernel": "k0", "grid": ["CeilDiv(s0, 1)", 1, 1],
                   "args": [{"kind": "ptr", "buffer": {"group": "input", "index": 0}, …},
                            {"kind": "i32", "expr": "s0", …}, {"kind": "f32", "value": 2.5, …}]}]}

``params`` are read from the compiled PTX ``.entry`` signature: the launch arguments first, then the
scratch pointers Triton appends (``global_scratch`` since 3.3, ``profile_scratch`` since 3.5), which the
runtime passes as device pointers, or 0 when their size is 0. Scalars are packed at ``bytes`` wide
(fp32 as 4 bytes, fp16/bf16 as their 2-byte bit pattern).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import shapes
from .container import member_name_ok
from .cpu_features import LEVEL_FEATURES
from .cpu_features import LEVELS as CPU_LEVELS  # the levels are defined once, with their features
from .errors import IncompatiblePackage, PackageCorrupt
from .manifest import (
    FORMAT,
    FORMAT_VERSION,
    HASH_CHUNK,
    INTERFACE_MARK,
    ITEMSIZE,
    MANIFEST,
    MAX_DIM,
    MAX_MANIFEST_BYTES,
    MAX_RANK,
    PARAM_BYTES,
    RETURNS,
    SCALAR_BYTES,
    SCRATCH,
    Arg,
    CpuTarget,
    CudaTarget,
    IndexRange,
    Kernel,
    Launch,
    Manifest,
    Member,
    ModelInfo,
    Param,
    Ref,
    SelfTest,
    Slot,
    Symbol,
    Target,
    TensorSpec,
    Weights,
    cpu_interface,
    dtype_name,
    interface_text,
    numpy_dtype,
)
from .reader import MAX_SIZE as MAX_BYTES  # the largest buffer any size may come to (int64 math in C stays exact)
from .reader import bad as _bad
from .reader import plain, read
from .reader import size as _size
from .shapes import Size

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HASH_CHUNK",
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "INTERFACE_MARK",
    "MAX_DIM",
    "MAX_RANK",
    "ITEMSIZE",
    "RETURNS",
    "SCALAR_BYTES",
    "SCRATCH",
    "PARAM_BYTES",
    "numpy_dtype",
    "dtype_name",
    "ModelInfo",
    "Symbol",
    "TensorSpec",
    "Weights",
    "CpuTarget",
    "Param",
    "Kernel",
    "Ref",
    "Arg",
    "Launch",
    "Slot",
    "CudaTarget",
    "Target",
    "Member",
    "IndexRange",
    "SelfTest",
    "Manifest",
    "interface_text",
    "cpu_interface",
    "to_dict", "to_json", "from_dict", "from_json", "strict_json", "check_member_name", "validate",
    "extreme_envs", "nbytes", "size_at", "MAX_BYTES",
]  # fmt: skip


# ---- JSON ------------------------------------------------------------------------------------------------


def to_dict(m: Manifest) -> dict[str, Any]:
    return {"format": FORMAT, **plain(m)}


def to_json(m: Manifest) -> str:
    """Canonical JSON: sorted keys, so equal manifests give equal bytes."""
    validate(m)
    return json.dumps(to_dict(m), sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


def from_dict(d: object) -> Manifest:
    """A validated Manifest from parsed JSON. Format and version are checked first: a package from another
    format version is refused as incompatible before its other fields are read."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        fmt = d.get("format") if isinstance(d, dict) else None
        raise PackageCorrupt(f"not an aotc package: manifest.json has format={fmt!r}, expected {FORMAT!r}")
    version = d.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _bad("format_version", f"expected an integer, got {version!r}")
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
    try:
        m = read(Manifest, {k: v for k, v in d.items() if k != "format"})
        validate(m)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError, OverflowError) as e:
        # A check above that missed a malformed value: still a refusal of the package, never a traceback.
        raise PackageCorrupt(f"manifest.json cannot be read ({type(e).__name__}: {str(e)[:200]}); the package is damaged") from None
    return m


def from_json(text: str | bytes) -> Manifest:
    if len(text) > MAX_MANIFEST_BYTES:
        raise PackageCorrupt(f"manifest.json is {len(text)} bytes, over the {MAX_MANIFEST_BYTES} byte limit")
    return from_dict(strict_json(text, "manifest.json"))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def strict_json(text: str | bytes, what: str) -> Any:
    """JSON as the writer makes it: no duplicate keys, no NaN or Infinity; nesting too deep for the parser,
    like every other fault, is PackageCorrupt naming ``what``."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError, MemoryError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError | MemoryError) else str(e)[:200]
        raise PackageCorrupt(f"{what} is not valid JSON ({why}); the package is damaged or was not written by aotc") from None


# ---- cross-field checks ----------------------------------------------------------------------------------

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_member_name(path: str, where: str = "members") -> None:
    """A member path must be relative, '/'-separated, without '.', '..' or empty parts (no path traversal)."""
    if not member_name_ok(path):
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
    if m.model.returns not in RETURNS:
        raise _bad("model.returns", f"{m.model.returns!r} is not one of {', '.join(RETURNS)}")
    for i, s in enumerate(m.symbols):
        if not _NAME.fullmatch(s.name):
            raise _bad(f"symbols[{i}].name", f"{s.name!r} is not an identifier")
        if s.min < 0 or (s.max is not None and s.max < s.min):
            raise _bad(f"symbols[{i}]", f"bad range [{s.min}, {s.max}]")
        if max(s.min, s.max or 0) > MAX_DIM:
            raise _bad(f"symbols[{i}]", f"range [{s.min}, {s.max}] reaches past 2**40, more than any tensor holds")
    _unique((s.name for s in m.symbols), "symbols")
    declared = {s.name for s in m.symbols}
    _unique((t.name for t in m.inputs), "inputs")
    for i, r in enumerate(m.index_ranges):
        spec = next((t for t in m.inputs if t.name == r.input), None)
        if spec is None or not spec.dtype.startswith(("int", "uint")) or r.size < 1:
            raise _bad(f"index_ranges[{i}]", f"{r.input!r} is not an integer input, or size {r.size} < 1")
    _unique((t.name for t in m.outputs), "outputs")
    _unique((t.name for t in m.weights.tensors), "weights.tensors")
    groups = [("inputs", m.inputs), ("outputs", m.outputs), ("weights.tensors", m.weights.tensors)]
    for i, cpu in enumerate(m.targets):
        if isinstance(cpu, CpuTarget) and cpu.packed is not None:
            check_member_name(cpu.packed.member, f"targets[{i}].packed.member")
            _unique((t.name for t in cpu.packed.tensors), f"targets[{i}].packed.tensors")
            groups.append((f"targets[{i}].packed.tensors", cpu.packed.tensors))
    for group, specs in groups:
        for i, t in enumerate(specs):
            if t.dtype not in ITEMSIZE:
                raise _bad(f"{group}[{i}].dtype", f"unknown dtype {t.dtype!r} (known: {', '.join(ITEMSIZE)})")
            if len(t.shape) > MAX_RANK:
                raise _bad(f"{group}[{i}].shape", f"rank {len(t.shape)} is over the limit of {MAX_RANK}")
            for a, d in enumerate(t.shape):
                _expr(d, f"{group}[{i}].shape[{a}]", declared)
            if group.endswith("tensors") and not t.is_static:
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
            lacking = [f for f in LEVEL_FEATURES[tg.level] if f not in tg.features]
            if lacking:
                raise _bad(f"targets[{i}].features", f"level {tg.level} needs {', '.join(lacking)}, which the list leaves out")
            _expr(tg.arena_bytes, f"targets[{i}].arena_bytes", declared)
            if not isinstance(tg.min_glibc, str) or (tg.min_glibc and not re.fullmatch(r"\d+\.\d+", tg.min_glibc)):
                raise _bad(f"targets[{i}].min_glibc", f"expected a glibc version like '2.36', got {tg.min_glibc!r}")
        else:
            _check_cuda(m, tg, f"targets[{i}]", declared)
    if m.selftest is not None:
        st = m.selftest
        check_member_name(st.member, "selftest.member")
        if len(st.inputs) != len(m.inputs) or len(st.outputs) != len(m.outputs):
            raise _bad("selftest", "needs one key per input and one per output")
        if not (0 <= st.rtol <= 1 and 0 <= st.atol <= 1):  # NaN fails both; past 1 a self-test tests nothing
            raise _bad("selftest", f"bad tolerances rtol={st.rtol} atol={st.atol} (each must be in [0, 1])")
    for path, mem in m.members.items():
        check_member_name(path, f"members[{path!r}]")
        if not _SHA256.fullmatch(mem.sha256):
            raise _bad(f"members.{path}.sha256", "not a lowercase hex sha256")
        if not 0 <= mem.size <= MAX_BYTES:
            raise _bad(f"members.{path}.size", f"{mem.size} is out of range")
        if len(mem.chunks) != (-(-mem.size // HASH_CHUNK) if mem.size > HASH_CHUNK else 0):
            raise _bad(f"members.{path}.chunks", f"{len(mem.chunks)} chunk hashes for {mem.size} bytes in {HASH_CHUNK}-byte chunks")
        if not all(_SHA256.fullmatch(c) for c in mem.chunks):
            raise _bad(f"members.{path}.chunks", "not lowercase hex sha256s")
    if m.members:
        for path in m.referenced_members():
            if path not in m.members:
                raise _bad("members", f"{path!r} is referenced but not listed")
    _check_extremes(m)


def extreme_envs(symbols: tuple[Symbol, ...]) -> list[dict[str, int]]:
    """Every symbol at its minimum, then at its maximum (its minimum when unbounded)."""
    lo = {s.name: s.min for s in symbols}
    hi = {s.name: s.min if s.max is None else s.max for s in symbols}
    return [lo] if hi == lo else [lo, hi]


def nbytes(spec: TensorSpec, env: Mapping[str, int], where: str) -> int:
    """The byte size of ``spec`` under ``env``; PackageCorrupt when a size cannot be computed, is negative, or
    comes to more than any machine holds (the C code would compute it in int64)."""
    try:
        shape = [shapes.evaluate(d, env) for d in spec.shape]
    except shapes.ShapeExprError as e:
        raise _bad(where, str(e)) from None
    total = math.prod(shape) * ITEMSIZE[spec.dtype]
    if min(shape, default=0) < 0 or total > MAX_BYTES or max(shape, default=0) > MAX_BYTES:
        raise _bad(where, f"comes to {spec.dtype}{shape} at {dict(env)}, which no buffer can be")
    return total


def size_at(size: Size, env: Mapping[str, int], where: str) -> int:
    """A size under ``env``, bounded like ``nbytes``."""
    try:
        v = shapes.evaluate(size, env)
    except shapes.ShapeExprError as e:
        raise _bad(where, str(e)) from None
    if not 0 <= v <= MAX_BYTES:
        raise _bad(where, f"{size!r} comes to {v} at {dict(env)}, which no buffer can be")
    return v


def _check_extremes(m: Manifest) -> None:
    """Inputs, outputs and arenas at the symbols' extremes: a division by zero or a size past int64 is found
    here, at load, not in the middle of a call."""
    for env in extreme_envs(m.symbols):
        for group, specs in (("inputs", m.inputs), ("outputs", m.outputs)):
            for i, spec in enumerate(specs):
                nbytes(spec, env, f"{group}[{i}].shape")
        for i, t in enumerate(m.targets):
            size_at(t.arena_bytes, env, f"targets[{i}].arena_bytes")


_ARCH = re.compile(r"sm_[0-9]+a?")


def _expr(d: Size, where: str, declared: set[str]) -> None:
    _size(d, where)
    undeclared = shapes.symbols(d) - declared
    if undeclared:
        raise _bad(where, f"undeclared symbol {sorted(undeclared)[0]!r}")


def _check_cuda(m: Manifest, t: CudaTarget, where: str, declared: set[str]) -> None:
    """What the reader cannot see field by field: names, parameter widths, and launches that fit their
    kernels and name buffers that exist."""
    if not _ARCH.fullmatch(t.arch):
        raise _bad(f"{where}.arch", f"{t.arch!r} is not of the form sm_NN")
    if t.min_driver < 0:
        raise _bad(f"{where}.min_driver", f"negative ({t.min_driver})")
    _expr(t.arena_bytes, f"{where}.arena_bytes", declared)
    for j, s in enumerate(t.arena):
        if not _NAME.fullmatch(s.name):
            raise _bad(f"{where}.arena[{j}].name", f"{s.name!r} is not an identifier")
        _expr(s.offset, f"{where}.arena[{j}].offset", declared)
    _unique((s.name for s in t.arena), f"{where}.arena")
    member = re.compile(rf"cuda/{re.escape(t.arch)}/[A-Za-z_][A-Za-z0-9_]*\.")
    for j, k in enumerate(t.kernels):
        at = f"{where}.kernels[{j}]"
        if not _NAME.fullmatch(k.name):
            raise _bad(f"{at}.name", f"{k.name!r} is not a kernel name")
        if k.member is None and k.ptx is None:
            raise _bad(f"{at}.member", "neither a cubin nor PTX: nothing to load")
        for key, path, ext in (("member", k.member, "cubin"), ("source", k.source, "py"), ("ptx", k.ptx, "ptx")):
            if path is not None and not (member.match(path) and path == f"{path.rsplit('.', 1)[0]}.{ext}"):
                raise _bad(f"{at}.{key}", f"{path!r} is not a cuda/{t.arch}/<name>.{ext} member")
        for n, p in enumerate(k.params):
            if PARAM_BYTES.get(p.kind) != p.bytes or (n < k.num_args) == (p.kind in SCRATCH):
                raise _bad(f"{at}.params[{n}]", f"kind {p.kind!r} with {p.bytes} bytes is not a known parameter here")
        counts = {"num_warps": k.num_warps, "num_ctas": k.num_ctas, "global_scratch_align": k.global_scratch_align,
                  "profile_scratch_align": k.profile_scratch_align}  # fmt: skip
        counts.update({f"cluster_dims[{n}]": c for n, c in enumerate(k.cluster_dims)})
        for key, v in counts.items():
            if v < 1:
                raise _bad(f"{at}.{key}", f"must be at least 1, got {v}")
        for key, v in (("shared", k.shared), ("global_scratch_size", k.global_scratch_size),
                       ("profile_scratch_size", k.profile_scratch_size)):  # fmt: skip
            if v < 0:
                raise _bad(f"{at}.{key}", f"negative ({v})")
    _unique((k.name for k in t.kernels), f"{where}.kernels")
    kernels = {k.name: k for k in t.kernels}
    counts = {"input": len(m.inputs), "output": len(m.outputs), "weight": len(m.weights.tensors), "arena": len(t.arena)}
    for j, x in enumerate(t.launches):
        at = f"{where}.launches[{j}]"
        if x.kernel not in kernels:
            raise _bad(f"{at}.kernel", f"names no kernel of this target: {x.kernel!r}")
        k = kernels[x.kernel]
        for n, g in enumerate(x.grid):
            _expr(g, f"{at}.grid[{n}]", declared)
        if len(x.args) != k.num_args:
            raise _bad(f"{at}.args", f"{len(x.args)} arguments for kernel {k.name!r}, whose PTX takes {k.num_args}")
        for n, a in enumerate(x.args):
            _check_arg(a, k.params[n].kind, f"{at}.args[{n}]", counts, declared)


def _check_arg(a: Arg, want: str, where: str, counts: dict[str, int], declared: set[str]) -> None:
    if a.kind != want:
        raise _bad(f"{where}.kind", f"{a.kind!r} but the kernel's parameter is {want!r}")
    given = [k for k, v in (("buffer", a.buffer), ("expr", a.expr), ("value", a.value)) if v is not None]
    need = "buffer" if a.kind == "ptr" else given[0] if given in (["expr"], ["value"]) else "expr or value"
    if given != [need]:
        raise _bad(where, f"a {a.kind} argument takes exactly one {need}, got {given or 'none'}")
    if a.buffer is not None and not 0 <= a.buffer.index < counts[a.buffer.group]:
        raise _bad(f"{where}.buffer", f"names no buffer of this target: {a.buffer.group} {a.buffer.index}")
    if a.expr is not None:
        _expr(a.expr, f"{where}.expr", declared)
    if a.value is not None and a.kind[0] in "iu" and not isinstance(a.value, int):
        raise _bad(f"{where}.value", f"{a.value!r} is not an integer for a {a.kind} argument")
