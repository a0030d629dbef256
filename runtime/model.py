"""``aotc.load`` and ``Model``: choose a device and target, check every input, run, and self-test.

What it is: the user-facing API. ``load`` opens a package, picks CUDA (through ``aotc.cuda``, imported only
when the package has a CUDA target) or the best CPU target, and returns a ``Model``. ``Model.run`` checks
names, dtypes (exactly: no silent casts), ranks, static sizes and dynamic-dimension ranges, binds the
symbols, and only then calls the executor. ``Model.verify`` runs the package's self-test.
What it is not: an executor. ``aotc.cpu`` and ``aotc.cuda`` own the calls into generated code; they share
the small ``Executor`` protocol below.

Note: a symbol is bound by the first input dimension that *is* that symbol (``"s0"``); every other
dimension (an int or an expression such as ``"2*s0"``) is then evaluated and compared. The schema refuses
packages where some symbol is not a plain dimension of any input, so binding never needs to solve anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import InputMismatch, PackageCorrupt, UsageError
from .indices import index_error
from .package import Package
from .schema import Manifest, Symbol, TensorSpec, dtype_name, nbytes, numpy_dtype
from .shapes import ShapeExprError, Size, evaluate

if TYPE_CHECKING:
    from dataclasses import dataclass
else:
    from .records import dataclass  # no methods compiled at import (see aotc.records)


class Executor(Protocol):
    """What ``Model`` needs from a device back end (``aotc.cpu.CpuExecutor``, ``aotc.cuda``'s executor)."""

    device: str  # "cpu", "cuda:0"
    target: str  # "cpu:x86-64-v4", "cuda:sm_90"

    def accept(self, value: Any, spec: TensorSpec) -> tuple[Any, tuple[int, ...], str]:
        """The input as the executor's array type, its shape, and its dtype as a manifest dtype name (or a
        description of a dtype the format does not have). Raises InputMismatch for unusable values
        (e.g. on a device the executor cannot read)."""
        ...

    def execute(self, inputs: Sequence[Any], env: Mapping[str, int], out_shapes: Sequence[tuple[int, ...]]) -> list[Any]:
        """Run once on checked inputs; ``env`` binds every symbol; returns the outputs in manifest order."""
        ...

    def to_host(self, value: Any) -> np.ndarray:
        """An output as a numpy array (for the self-test)."""
        ...

    def close(self) -> None:
        """Release code and device memory now; later calls raise UsageError."""
        ...


@dataclass(frozen=True)
class OutputCheck:
    """One output of a self-test run compared with the recorded eager output."""

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


class Model:
    """A loaded package, ready to run. ``model(x)`` or ``model.run({"x": x})``."""

    def __init__(self, package: Package, executor: Executor, fallback: str | None = None) -> None:
        self.package = package
        self.manifest: Manifest = package.manifest
        self.executor = executor
        self.fallback = fallback  # why device="auto" did not pick CUDA, when it did not
        self.inputs: tuple[TensorSpec, ...] = self.manifest.inputs
        self.outputs: tuple[TensorSpec, ...] = self.manifest.outputs
        self.symbols: tuple[Symbol, ...] = self.manifest.symbols
        self._sym = {s.name: s for s in self.symbols}
        # input shapes -> (symbol values, output shapes): the checks behind them depend on the shapes alone
        self._bindings: dict[tuple[tuple[int, ...], ...], tuple[dict[str, int], list[tuple[int, ...]]]] = {}

    def close(self) -> None:
        """Unload the code and unmap the package now rather than at garbage collection."""
        self.executor.close()
        self.package.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def device(self) -> str:
        return self.executor.device

    @property
    def target(self) -> str:
        return self.executor.target

    # -- printing sizes with the user's labels --

    def pretty(self, size: Size) -> str:
        return self.manifest.pretty(size)

    def describe(self, spec: TensorSpec) -> str:
        return self.manifest.describe(spec)

    def signature(self) -> str:
        ins = ", ".join(f"{s.name}: {self.describe(s)}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {self.describe(s)}" for s in self.outputs)
        return f"({ins}) -> ({outs})"

    def __repr__(self) -> str:
        return f"<aotc.Model {self.manifest.model.name} on {self.target} {self.signature()}>"

    # -- checking inputs --

    def _check_names(self, feeds: Mapping[str, Any]) -> None:
        names = {s.name for s in self.inputs}
        for k in feeds:
            if k not in names:
                raise InputMismatch(f"unknown input {k!r}; this model takes {self.signature()}")
        for s in self.inputs:
            if s.name not in feeds:
                raise InputMismatch(f"missing input {s.name!r} ({self.describe(s)}); this model takes {self.signature()}")

    def _check_dtype(self, spec: TensorSpec, got: str) -> None:
        if got != spec.dtype:
            to = "ml_dtypes.bfloat16" if spec.dtype == "bfloat16" else f"numpy.{spec.dtype}"
            raise InputMismatch(
                f"input {spec.name!r}: got dtype {got}, expected {spec.dtype} ({self.describe(spec)}); "
                f"aotc never casts silently: pass {spec.name}.astype({to})"
            )

    def bind(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
        """The symbol values the input shapes imply, after checking every dimension against the package."""
        env: dict[str, int] = {}
        origin: dict[str, tuple[str, int]] = {}  # where each symbol was bound
        for spec, shape in zip(self.inputs, shapes, strict=True):
            if len(shape) != len(spec.shape):
                raise InputMismatch(
                    f"input {spec.name!r}: got rank {len(shape)} (shape {list(shape)}), expected rank "
                    f"{len(spec.shape)}: {self.describe(spec)}"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
                if isinstance(want, int):
                    self._check_static(spec, axis, want, got)
                elif want in self._sym and want in env:
                    self._check_agrees(spec, axis, self._sym[want], got, (*origin[want], env[want]))
                elif want in self._sym:
                    self._check_range(spec, axis, self._sym[want], got)
                    env[want] = got
                    origin[want] = (spec.name, axis)
        # Expressions ("2*s0") once every symbol is bound.
        for spec, shape in zip(self.inputs, shapes, strict=True):
            for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
                if isinstance(want, str) and want not in self._sym:
                    self._check_expr(spec, axis, want, got, env)
        return env

    def _check_static(self, spec: TensorSpec, axis: int, want: int, got: int) -> None:
        if got != want:
            raise InputMismatch(
                f"input {spec.name!r} axis {axis}: got size {got}, expected {want} ({self.describe(spec)}); "
                f"this size is fixed in the package: pass size {want}, or rebuild with "
                f"--dynamic {spec.name}:{axis}:NAME:MIN:MAX"
            )

    def _check_agrees(self, spec: TensorSpec, axis: int, sym: Symbol, got: int, bound: tuple[str, int, int]) -> None:
        """``bound``: the input, axis and value that bound ``sym`` first."""
        if got != bound[2]:
            raise InputMismatch(
                f"input {spec.name!r} axis {axis} ({sym.label}): got {got}, but input {bound[0]!r} axis "
                f"{bound[1]} has {sym.label}={bound[2]}; inputs must agree on {sym.label}"
            )

    def _check_range(self, spec: TensorSpec, axis: int, sym: Symbol, got: int) -> None:
        if got < sym.min or (sym.max is not None and got > sym.max):
            hi = "inf" if sym.max is None else sym.max
            raise InputMismatch(
                f"input {spec.name!r} axis {axis} ({sym.label}): got {sym.label}={got}, outside the range "
                f"[{sym.min}, {hi}] the package was built for; pass {sym.min} <= {sym.label} <= {hi} "
                f"(e.g. split the call), or rebuild with --dynamic {spec.name}:{axis}:{sym.label}:MIN:MAX"
            )

    def _check_expr(self, spec: TensorSpec, axis: int, want: str, got: int, env: Mapping[str, int]) -> None:
        try:
            value = evaluate(want, env)
        except ShapeExprError as e:
            raise InputMismatch(f"input {spec.name!r} axis {axis}: size {self.pretty(want)}: {e}") from None
        if got != value:
            where = ", ".join(f"{self._sym[n].label}={v}" for n, v in env.items())
            raise InputMismatch(
                f"input {spec.name!r} axis {axis}: got size {got}, expected {self.pretty(want)} = {value} "
                f"(with {where}); {self.describe(spec)}"
            )

    def output_shapes(self, env: Mapping[str, int]) -> list[tuple[int, ...]]:
        """Each output's shape under ``env``; a shape that cannot be computed, or that comes out negative or
        past int64, is the package's fault (PackageCorrupt): the inputs were checked against their ranges."""
        out = []
        for i, spec in enumerate(self.outputs):
            nbytes(spec, env, f"outputs[{i}].shape")
            out.append(tuple(evaluate(d, env) for d in spec.shape))
        return out

    def _check_indices(self, feeds: Mapping[str, Any]) -> None:
        """Token ids and other table indices in range, where they are on the host (numpy arrays, after the
        executor's ``accept``: a list of ids counts too); the CUDA executor checks device-resident ones on
        the device (``aotc.indices``)."""
        for r in self.manifest.index_ranges:
            v = feeds.get(r.input)
            if isinstance(v, np.ndarray):
                err = index_error(r, v)
                if err is not None:
                    raise err

    # -- running --

    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> dict[str, Any]:
        """Run once; ``feeds`` maps every input name to an array. Returns the outputs by name, in manifest
        order, or only ``output_names``, in that order (the package still computes every output: this
        saves reading back and copying the others, not their kernels)."""
        pick = None if output_names is None else self._pick_outputs(output_names)
        if not isinstance(feeds, Mapping):
            raise InputMismatch(
                f"Model.run takes a mapping of input names to arrays, got {type(feeds).__name__}: "
                f"model.run({{{', '.join(f'{s.name!r}: ...' for s in self.inputs)}}}), or call model(...) with positional inputs"
            )
        self._check_names(feeds)
        arrays, shapes = [], []
        for spec in self.inputs:
            arr, shape, dtype = self.executor.accept(feeds[spec.name], spec)
            self._check_dtype(spec, dtype)
            arrays.append(arr)
            shapes.append(shape)
        if self.manifest.index_ranges:
            self._check_indices(dict(zip(self.input_names, arrays, strict=True)))
        key = tuple(shapes)
        bound = self._bindings.get(key)
        if bound is None:
            env = self.bind(shapes)
            bound = self._bindings[key] = (env, self.output_shapes(env))
            if len(self._bindings) > 256:
                self._bindings.clear()
        outs = self.executor.execute(arrays, *bound)
        if pick is not None:
            return {self.outputs[i].name: outs[i] for i in pick}
        return {spec.name: o for spec, o in zip(self.outputs, outs, strict=True)}

    def _pick_outputs(self, names: Sequence[str]) -> list[int]:
        if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
            raise UsageError(f"output_names must be a list of output names, e.g. {[self.outputs[0].name]!r}, got {names!r}")
        index = {s.name: i for i, s in enumerate(self.outputs)}
        for n in names:
            if n not in index:
                raise UsageError(f"unknown output {n!r}; this model's outputs are {', '.join(index)}")
        return [index[n] for n in names]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inputs by position (manifest order) and/or name. Returns what the model's forward() returned, in
        arrays: a dict by output name when it returned a dict, named tuple, dataclass or ModelOutput
        (``manifest.model.returns == "dict"``); otherwise one output, or a tuple of them in order."""
        if len(args) > len(self.inputs):
            raise InputMismatch(f"got {len(args)} positional inputs, this model takes {len(self.inputs)}: {self.signature()}")
        feeds = dict(zip((s.name for s in self.inputs), args, strict=False))
        for k, v in kwargs.items():
            if k in feeds:
                raise InputMismatch(f"input {k!r} given both by position and by name")
            feeds[k] = v
        by_name = self.run(feeds)
        if self.manifest.model.returns == "dict":
            return by_name
        outs = tuple(by_name.values())
        return outs[0] if len(outs) == 1 else outs

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    # -- threads --

    @property
    def num_threads(self) -> int | None:
        """The CPU thread limit per call (None: every core the process may use); None on a GPU."""
        get = getattr(self.executor, "num_threads", None)
        if get is not None or self.device != "cpu":
            return get
        n = abs(int(getattr(self.executor, "_threads", 0)))
        return n or None

    @num_threads.setter
    def num_threads(self, n: int | None) -> None:
        """Change the thread limit of a loaded model; takes effect from the next call."""
        if self.device != "cpu":
            raise UsageError(f"num_threads applies to CPU targets; this model runs on {self.device}")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise UsageError(f"num_threads must be a non-negative int or None (every core), got {n!r}")
        set_threads = getattr(self.executor, "set_threads", None)
        if set_threads is not None:  # aotc.cpu's own setter (it also resets what the pool's policy learnt)
            set_threads(n or None)
            return
        # An executor without one hands its count to the library before every call (CpuExecutor.run); a
        # fixed count (negative) stays fixed.
        ex: Any = self.executor
        with ex._lock:
            ex._threads = -(n or 0) if ex._threads < 0 and n else (n or 0)

    # -- explicit conversions --

    def cast(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """``feeds`` with each numpy array converted to its input's dtype, where that is a conversion between
        floating types (float32 -> bfloat16 rounds to nearest even) or between integer types whose values
        all fit. The opt-in behind ``--cast``: ``run`` itself never converts."""
        out = dict(feeds)
        for spec in self.inputs:
            v = out.get(spec.name)
            if isinstance(v, np.ndarray):
                out[spec.name] = cast_array(spec, v, self.describe(spec))
        return out

    # -- self-test --

    def verify(self) -> list[OutputCheck]:
        """Run the package's self-test inputs and compare with the recorded eager outputs."""
        st = self.manifest.selftest
        if st is None:
            raise UsageError(f"{self.package.path} has no self-test (it was built with --no-selftest)")
        data = self.package.tensors(st.member)
        for key in (*st.inputs, *st.outputs):
            if key not in data:
                raise PackageCorrupt(f"{self.package.path}: self-test tensor {key!r} is missing from {st.member}")
        got = self.run({s.name: data[k] for s, k in zip(self.inputs, st.inputs, strict=True)})
        return [
            compare(name, self.executor.to_host(got[name]), data[key], st.rtol, st.atol) for name, key in zip(got, st.outputs, strict=True)
        ]


def cast_array(spec: TensorSpec, arr: np.ndarray, described: str) -> np.ndarray:
    """``arr`` as ``spec``'s dtype when the conversion is float to float or int to int (values checked);
    InputMismatch for anything else (a float to an integer input would drop fractions silently)."""
    want = numpy_dtype(spec.dtype)
    if arr.dtype == want:
        return arr
    got = dtype_name(arr.dtype) or arr.dtype.str
    floats = ("float32", "float64", "float16", "bfloat16")
    if got in floats and spec.dtype in floats:
        with np.errstate(over="ignore"):
            return arr.astype(want)
    if arr.dtype.kind in "iu" and want.kind in "iu":
        info = np.iinfo(want)
        if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
            raise InputMismatch(f"input {spec.name!r}: values outside the range of {spec.dtype} cannot be cast ({described})")
        return arr.astype(want)
    raise InputMismatch(
        f"input {spec.name!r}: cannot cast {got} to {spec.dtype} ({described}); only float to float and int to int are cast"
    )


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> OutputCheck:
    """``got`` against ``want`` like numpy.allclose (NaN equal to NaN); integers and bools exactly."""
    if got.shape != want.shape:
        return OutputCheck(name, float("inf"), float("inf"), False, f"shape {list(got.shape)} != {list(want.shape)}")
    if got.size == 0:
        return OutputCheck(name, 0.0, 0.0, True)
    exact = want.dtype.kind in "biu"
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - w)
        both_nan = np.isnan(g) & np.isnan(w)
        diff = np.where(both_nan, 0.0, np.where(np.isnan(diff), np.inf, diff))
        bound = 0.0 if exact else atol + rtol * np.abs(w)
        ok = bool(np.all(diff <= bound))
        nonzero = np.abs(w) > 0
        rel = float(np.max(diff[nonzero] / np.abs(w[nonzero]))) if nonzero.any() else 0.0
    return OutputCheck(name, float(np.max(diff)), rel, ok)
