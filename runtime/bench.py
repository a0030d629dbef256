"""``aotc bench PKG``: how fast a package loads, answers first, and runs, on this machine.

What it is: the numbers trtexec and onnxruntime_perf_test print. Load time (open, hash-check, dlopen or
module load), the first call, then ``--warmup`` calls untimed and ``--iterations`` calls timed one by one
(CUDA: each call ends in a device sync): p50/p90/p99, mean, calls and samples per second, and a warning
when the spread is too wide to trust. Inputs are the package's self-test inputs (the build's example
inputs), or random ones of ``--shape`` sizes, or ``--input NAME=FILE.npy``.
What it is not: a comparison with torch (``benchmarks/`` does that), or a profiler.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from .cli_group import device_option, refusals, trust_options, trusted_keys
from .errors import InputMismatch, UsageError
from .loading import load
from .model import Model
from .schema import TensorSpec, dtype_name
from .shapes import evaluate

SPREAD_LIMIT = 1.5  # p90 / p50 above this: the machine was busy, or threads fought for cores


@dataclass
class BenchResult:
    package: str
    target: str
    threads: int | None
    inputs: dict[str, str]
    load_ms: float
    first_call_ms: float
    iterations: int
    warmup: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    calls_per_s: float
    samples_per_s: float
    spread: float  # p90 / p50
    warning: str | None


def parse_shapes(specs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for s in specs:
        name, sep, dims = s.partition(":")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise UsageError(f"--shape {s!r}: use NAME:D0xD1x..., e.g. x:8x128")
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def _random(spec: TensorSpec, shape: tuple[int, ...], example: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    if spec.dtype == "bool":
        return rng.random(shape) < 0.5
    if spec.dtype.startswith(("int", "uint")):
        # token ids and indices: stay inside what the example used, so an embedding is never read out of range
        hi = int(example.max()) + 1 if example is not None and example.size else 2
        lo = int(example.min()) if example is not None and example.size else 0
        return rng.integers(lo, max(hi, lo + 1), size=shape).astype(spec.dtype)
    x = rng.standard_normal(shape, dtype=np.float32)
    if spec.dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(spec.dtype)


def make_inputs(model: Model, shapes: dict[str, tuple[int, ...]], files: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """Given files first, then the self-test inputs when no --shape changes them, else random of the shape
    (symbols fixed by the given shapes or the self-test, static dims as built)."""
    names = [s.name for s in model.inputs]
    for n in (*shapes, *files):
        if n not in names:
            raise UsageError(f"the package has no input {n!r} (inputs: {', '.join(names)})")
    st = model.manifest.selftest
    examples: dict[str, np.ndarray] = {}
    if st is not None:
        data = model.package.tensors(st.member)
        examples = {s.name: data[k] for s, k in zip(model.inputs, st.inputs, strict=True) if k in data}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in model.inputs:
        ex = examples.get(spec.name)
        if spec.name in files:
            feeds[spec.name] = files[spec.name]
        elif spec.name not in shapes and not shapes and ex is not None:
            feeds[spec.name] = ex
        else:
            feeds[spec.name] = _random(spec, _shape_of(model, spec, shapes, examples), ex, rng)
    return feeds


def _shape_of(model: Model, spec: TensorSpec, shapes: dict[str, tuple[int, ...]], examples: dict[str, np.ndarray]) -> tuple[int, ...]:
    if spec.name in shapes:
        return shapes[spec.name]
    env: dict[str, int] = {}
    for other in model.inputs:  # symbols bound by the shapes given (or the examples')
        got = shapes.get(other.name) or (examples[other.name].shape if other.name in examples else None)
        if got is None or len(got) != len(other.shape):
            continue
        for d, n in zip(other.shape, got, strict=True):
            if isinstance(d, str) and re.fullmatch(r"[A-Za-z_]\w*", d):
                env.setdefault(d, int(n))
    for sym in model.manifest.symbols:
        env.setdefault(sym.name, max(sym.min, 1))
    try:
        return tuple(d if isinstance(d, int) else int(evaluate(d, env)) for d in spec.shape)
    except Exception:
        raise UsageError(f"cannot size input {spec.name!r} ({model.describe(spec)}): pass --shape {spec.name}:D0xD1...") from None


def file_feeds(model: Model, feeds: dict[str, np.ndarray], cast: bool) -> dict[str, np.ndarray]:
    """Arrays read from .npy files for ``aotc run`` and ``aotc bench``: bfloat16 (which .npy stores as raw
    2-byte voids) viewed as such, then converted to each input's dtype with ``--cast``, or else refused with
    an InputMismatch that names the dtypes and the flag."""
    specs = {s.name: s for s in model.inputs}
    out = dict(feeds)
    for name, arr in feeds.items():
        spec = specs.get(name)
        if spec is not None and spec.dtype == "bfloat16" and arr.dtype == np.dtype("V2"):
            import ml_dtypes

            out[name] = arr.view(ml_dtypes.bfloat16)
    if cast:
        return model.cast(out)
    for name, arr in out.items():
        spec = specs.get(name)
        got = dtype_name(arr.dtype) or arr.dtype.str
        same_kind = (arr.dtype.kind in "iu") == spec.dtype.startswith(("int", "uint")) if spec is not None else False
        if spec is not None and got != spec.dtype and arr.dtype.kind in "fiuV" and same_kind:
            raise InputMismatch(
                f"input {name!r}: the file holds {got}, the package takes {spec.dtype} ({model.describe(spec)}); "
                f"pass --cast to convert it, or save the array as {spec.dtype}"
            )
    return out


def _pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def run_bench(
    path: Path, device: str = "auto", threads: int | None = None, shapes: dict[str, tuple[int, ...]] | None = None,
    files: dict[str, np.ndarray] | None = None, warmup: int = 10, iterations: int = 100, cast: bool = False,
    keys: list[str] | None = None,
) -> BenchResult:  # fmt: skip
    t0 = time.perf_counter()
    model = load(path, device=device, num_threads=threads, trusted_keys=keys)
    load_ms = (time.perf_counter() - t0) * 1e3
    host = make_inputs(model, shapes or {}, file_feeds(model, files or {}, cast))
    ex = model.executor
    sync = getattr(ex, "synchronize", None) or (lambda: None)
    to_device = getattr(ex, "to_device", None)
    # On a GPU the inputs go up once, as a serving loop that keeps its tensors on the device would have them
    feeds: dict[str, Any] = {k: to_device(v) for k, v in host.items()} if to_device is not None else dict(host)

    def call() -> float:
        t = time.perf_counter()
        model.run(feeds)
        sync()
        return (time.perf_counter() - t) * 1e3

    first = call()
    for _ in range(warmup):
        call()
    times = [call() for _ in range(iterations)]
    p50, p90, p99 = _pct(times, 50), _pct(times, 90), _pct(times, 99)
    mean = sum(times) / len(times)
    batch = next((a.shape[0] for a in host.values() if a.ndim), 1)
    spread = p90 / p50 if p50 > 0 else 1.0
    warning = None
    if spread > SPREAD_LIMIT or mean > SPREAD_LIMIT * p50:
        # a skewed tail (most calls fast, some preempted) shows in the mean before it shows in p90
        what = f"p90 is {spread:.2f}x p50" if spread > SPREAD_LIMIT else f"the mean is {mean / p50:.2f}x p50 (p99 {p99:.3g} ms)"
        warning = (f"{what}: too wide to trust; the machine is busy or threads contend "
                   "(see `uptime`; try --threads, or more --iterations on a quiet machine)")  # fmt: skip
    model.close()
    return BenchResult(
        package=str(path), target=model.target, threads=threads,
        inputs={k: f"{v.dtype.name}{list(v.shape)}" for k, v in host.items()},
        load_ms=load_ms, first_call_ms=first, iterations=iterations, warmup=warmup, p50_ms=p50, p90_ms=p90, p99_ms=p99,
        mean_ms=mean, min_ms=min(times), calls_per_s=1e3 / mean, samples_per_s=batch * 1e3 / mean, spread=spread, warning=warning,
    )  # fmt: skip


@click.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, help="NAME=FILE.npy (default: the self-test inputs, or random).")
@click.option("--shape", "shapes", multiple=True, help="NAME:D0xD1..., random inputs of this shape, e.g. x:8x128.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: every core).")
@click.option("--warmup", type=click.IntRange(min=0), default=10, show_default=True, help="Untimed calls after the first.")
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=100, show_default=True, help="Timed calls.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--cast", is_flag=True, help="Convert --input arrays to the package's dtypes (e.g. float32 to bfloat16).")
@device_option
@trust_options
def bench(
    package: Path, inputs: tuple[str, ...], shapes: tuple[str, ...], threads: int | None, warmup: int, iterations: int,
    as_json: bool, cast: bool, device: str, trusted_key: tuple[str, ...], require_signature: bool,
) -> None:  # fmt: skip
    """Time PACKAGE here: load, first call, p50/p90/p99 and throughput."""
    with refusals():
        keys = trusted_keys(require_signature, trusted_key)
        if not package.exists():
            raise UsageError(f"{package} does not exist")
        dims = parse_shapes(shapes)
        files: dict[str, np.ndarray] = {}
        for spec in inputs:
            name, sep, file = spec.partition("=")
            if not sep or not name or not file:
                raise UsageError(f"--input {spec!r}: use NAME=FILE.npy")
            try:
                files[name] = np.load(file, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise UsageError(f"--input {name}: cannot read {file} as a .npy file: {e}") from None
        r = run_bench(package, device, threads, dims, files, warmup, iterations, cast, keys)
        if as_json:
            click.echo(json.dumps(asdict(r), indent=1, sort_keys=True))
        else:
            _print(r)


def _print(r: BenchResult) -> None:
    echo = click.echo
    echo(f"package     {r.package} on {r.target}" + (f", {r.threads} threads" if r.threads else ""))
    echo("inputs      " + ", ".join(f"{k}: {v}" for k, v in r.inputs.items()))
    echo(f"load        {r.load_ms:.1f} ms")
    echo(f"first call  {r.first_call_ms:.2f} ms")
    echo(f"latency     p50 {r.p50_ms:.3f} ms, p90 {r.p90_ms:.3f}, p99 {r.p99_ms:.3f}, mean {r.mean_ms:.3f}, min {r.min_ms:.3f}"
         f"  ({r.iterations} calls after {r.warmup} warm-up)")  # fmt: skip
    echo(f"throughput  {r.calls_per_s:.1f} calls/s, {r.samples_per_s:.1f} samples/s")
    if r.warning:
        click.echo(f"warning: {r.warning}", err=True)
