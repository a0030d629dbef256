"""The package format's definition: the manifest's frozen dataclasses, its constants and dtype names, and the
interface text a CPU library embeds. ``aotc.schema`` re-exports all of it; import from there.

What it is: data. Every field of a manifest is a field of a dataclass here; docs/format.md describes each
(tests/test_docs.py checks the two agree).
What it is not: reading or checking. ``aotc.schema`` turns JSON into these (through ``aotc.reader``) and
runs the cross-field and bounds checks; ``aotc.package`` reads the ZIP and checks hashes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .container import MANIFEST  # noqa: F401  (the container's facts, defined where the loader reads them first)
from .hashing import HASH_CHUNK  # noqa: F401  (members larger than this carry one sha256 per HASH_CHUNK-byte piece)
from .shapes import Size

if TYPE_CHECKING:
    from dataclasses import dataclass
else:
    from .records import dataclass  # the same frozen dataclasses, without compiling 96 methods at import

FORMAT = "aotc"
FORMAT_VERSION = 5  # 2: CUDA targets typed here, referring to the manifest's inputs/outputs/weights;
# 3: a CPU target may carry ``packed`` weights (its own safetensors member);
# 4: members over HASH_CHUNK bytes list a sha256 per chunk (checked in parallel at load), and every CPU
#    library carries its own interface (INTERFACE_MARK), which the runtime compares with the manifest;
# 5: every CUDA kernel carries its PTX (for GPUs newer than its cubins), and its cubin member may be absent;
#    ``model.returns`` names the outputs of a model that returned a dict
MAX_MANIFEST_BYTES = 64 << 20
INTERFACE_MARK = b"aotc-interface-1:"  # prefix of the NUL-terminated JSON a CPU library embeds
MAX_DIM = 1 << 40  # the largest size a symbol's range or a static dimension may name
MAX_RANK = 64
RETURNS = ("tuple", "dict")  # ModelInfo.returns

# Manifest dtype names (the values of aotc_build.ir.DType) and their item sizes.
ITEMSIZE: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
    "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
# Bytes of each kind of CUDA kernel parameter: pointers, scalars at their PTX width, Triton's scratch pointers.
SCALAR_BYTES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8}
SCRATCH = ("global_scratch", "profile_scratch")
PARAM_BYTES = {"ptr": 8, **SCALAR_BYTES, **dict.fromkeys(SCRATCH, 8)}


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
    dt = np.dtype(dt)
    name = _dtype_names().get(dt)
    if name is None and dt.name == "bfloat16" and dt == numpy_dtype("bfloat16"):
        return "bfloat16"  # whoever made a bfloat16 array has imported ml_dtypes already
    return name


@functools.cache
def _dtype_names() -> dict[np.dtype, str]:
    # a lookup, not == against each name: comparing with ml_dtypes' bfloat16 costs ~0.1 ms a time. Without
    # bfloat16: importing ml_dtypes takes ~0.1 s (seconds on a busy machine), most of a cold start.
    return {numpy_dtype(name): name for name in ITEMSIZE if name != "bfloat16"}


# ---- the dataclasses ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    name: str
    source_sha256: str
    frontend: str = "torch.export"  # what read the model: "torch.export" (a model.py) or "onnx"
    # What forward() returned, so ``model(x)`` can hand back the same shape: "tuple" (one tensor, a tuple or
    # a list: outputs by position) or "dict" (a dict, named tuple, dataclass or ModelOutput: by name)
    returns: str = "tuple"


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
    # Weights repacked at build time into this level's matmul panel layout; the library takes them after
    # the manifest's weights, in this order.
    packed: Weights | None = None
    kind: str = "cpu"


@dataclass(frozen=True)
class Param:
    """One parameter of a kernel's PTX ``.entry``: its kind (a key of PARAM_BYTES) and width."""

    kind: str
    bytes: int


@dataclass(frozen=True)
class Kernel:
    """One cubin (and its PTX): a compiled Triton function and what launching it needs."""

    name: str  # the function's name inside the cubin
    member: str | None  # package member holding the cubin (None: PTX only, for the driver's JIT)
    params: tuple[Param, ...]  # every PTX parameter, scratch pointers last
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
    # The PTX the cubin was assembled from: the driver JIT-compiles it on a GPU no cubin runs on (aotc.cuda).
    ptx: str | None = None

    @property
    def num_args(self) -> int:
        return sum(1 for p in self.params if p.kind not in SCRATCH)


@dataclass(frozen=True)
class Ref:
    """The buffer a pointer argument names: a manifest input, output or weight, or an arena slot, by index."""

    group: Literal["input", "output", "weight", "arena"]
    index: int


@dataclass(frozen=True)
class Arg:
    """A launch argument: a buffer's device pointer, a size expression, or a literal scalar."""

    kind: str  # "ptr" or a key of SCALAR_BYTES
    buffer: Ref | None = None
    expr: Size | None = None
    value: float | int | bool | None = None


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[Size, Size, Size]
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Slot:
    """An intermediate buffer at a byte offset in the arena."""

    name: str
    offset: Size


@dataclass(frozen=True)
class CudaTarget:
    """Cubins for one SM and the launch sequence that runs them; buffers are the manifest's or arena slots."""

    arch: str  # "sm_90"
    triton_version: str
    ptxas_version: str
    min_driver: int  # the cuDriverGetVersion() value the cubins need
    precision: str
    arena_bytes: Size
    arena: tuple[Slot, ...]
    kernels: tuple[Kernel, ...]
    launches: tuple[Launch, ...]
    kind: str = "cuda"

    @property
    def sm(self) -> int:
        return int(self.arch.removeprefix("sm_").rstrip("a"))

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)


Target = CpuTarget | CudaTarget


@dataclass(frozen=True)
class Member:
    sha256: str
    size: int
    chunks: tuple[str, ...] = ()  # the sha256 of each HASH_CHUNK-byte piece, when size > HASH_CHUNK


@dataclass(frozen=True)
class IndexRange:
    """An integer input whose values index a table (an embedding's rows): each value must be in [0, size).
    The runtime checks host arrays before the call, so an out-of-range token id is an InputMismatch naming
    the input and the size, not a kernel reading row 0 (or past the end)."""

    input: str
    size: int
    table: str  # what is indexed, for the message: "embedding weight 'wte.weight'"


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
    index_ranges: tuple[IndexRange, ...] = ()

    @property
    def cpu_targets(self) -> tuple[CpuTarget, ...]:
        return tuple(t for t in self.targets if isinstance(t, CpuTarget))

    @property
    def cuda_targets(self) -> tuple[CudaTarget, ...]:
        return tuple(t for t in self.targets if isinstance(t, CudaTarget))

    def pretty(self, size: Size) -> str:
        """A size with symbol names replaced by the user's labels: ``"2*s0"`` -> ``"2*batch"``."""
        labels = {s.name: s.label for s in self.symbols}
        return re.sub(r"[A-Za-z_]\w*", lambda t: labels.get(t.group(0), t.group(0)), str(size))

    def describe(self, spec: TensorSpec) -> str:
        """``float32[batch, 256]``."""
        return f"{spec.dtype}[{', '.join(self.pretty(d) for d in spec.shape)}]"

    def buffers(self, group: str) -> tuple[Any, ...]:
        """What a ``Ref`` of ``group`` indexes, for a CUDA target's arena given separately."""
        return {"input": self.inputs, "output": self.outputs, "weight": self.weights.tensors}[group]

    def referenced_members(self) -> list[str]:
        """Every member the manifest names: weights, libraries, cubins and their sources, the self-test."""
        out = [self.weights.member, *(t.library for t in self.cpu_targets)]
        out += [t.packed.member for t in self.cpu_targets if t.packed is not None]
        for t in self.cuda_targets:
            out += [p for k in t.kernels for p in (k.member, k.source, k.ptx) if p is not None]
        if self.selftest is not None:
            out.append(self.selftest.member)
        return out


# ---- what a CPU library was built for -----------------------------------------------------------------


def interface_text(
    level: str,
    symbols: Iterable[tuple[str, int, int | None]],
    inputs: Iterable[tuple[str, tuple[Size, ...]]],
    outputs: Iterable[tuple[str, tuple[Size, ...]]],
    weights: Iterable[tuple[str, tuple[Size, ...]]],
    arena_bytes: Size,
) -> str:
    """The canonical text of a CPU library's interface: everything that decides how many bytes it reads and
    writes (symbols and ranges, dtypes and shapes of inputs, outputs and weights in ABI order, the arena)
    and the level it was compiled for. The builder embeds it in the library after INTERFACE_MARK; the
    runtime compares it with ``cpu_interface`` of the manifest before dlopen, so a manifest that lies about
    a size is refused instead of letting the code write past a buffer."""
    doc = {
        "level": level,
        "symbols": [[n, lo, hi] for n, lo, hi in symbols],
        "inputs": [[d, list(s)] for d, s in inputs],
        "outputs": [[d, list(s)] for d, s in outputs],
        "weights": [[d, list(s)] for d, s in weights],
        "arena_bytes": arena_bytes,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cpu_interface(m: Manifest, t: CpuTarget) -> str:
    """What the manifest says the library of ``t`` was built for, as ``interface_text``."""
    weights = (*m.weights.tensors, *(t.packed.tensors if t.packed is not None else ()))
    return interface_text(
        t.level,
        ((s.name, s.min, s.max) for s in m.symbols),
        ((x.dtype, x.shape) for x in m.inputs),
        ((x.dtype, x.shape) for x in m.outputs),
        ((x.dtype, x.shape) for x in weights),
        t.arena_bytes,
    )
