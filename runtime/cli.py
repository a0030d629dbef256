"""The ``aotc`` command line: build, run, verify, inspect. Thin: parse, call, print, map errors to exit codes.

What it is: click commands over ``aotc.load`` / ``aotc.package`` (and, for ``build`` only, a lazy import of
``aotc_build.build``, so the runtime-only install keeps working). Every ``AotcError`` becomes one line on
stderr and its class's exit code (``aotc.errors``); no tracebacks for refusals.
What it is not: logic. Anything a user could want from Python lives in the library, not here.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from . import __version__
from .errors import EXIT_CODES, AotcError, InputMismatch, PackageCorrupt, UsageError, VerifyFailed
from .model import Model, load
from .package import Package
from .schema import ITEMSIZE, CpuTarget, to_dict
from .serve.cli import serve as serve_command

F = TypeVar("F", bound=Callable[..., Any])
_BUILD_DEPS = {"aotc_build", "torch", "triton", "sympy", "safetensors", "jinja2", "onnx"}

_EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code}  {name}" for name, code in sorted(EXIT_CODES.items(), key=lambda kv: kv[1]))


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except AotcError as e:
        click.echo(f"aotc: {type(e).__name__}: {e}", err=True)
        sys.exit(e.exit_code)


def _device_option(f: F) -> F:
    return click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")(f)


@click.group(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aotc")
def cli() -> None:
    """Ahead-of-time compiled PyTorch models: build a package once, run it without torch."""


@cli.command(epilog=_EPILOG)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The .pkg to write.",
)
@click.option("--target", "targets", multiple=True, help="cpu[:LEVEL|native] or cuda:sm_NN; repeat or comma-separate.")
@click.option("--entry", default=None, help="Name of the model (or model factory) in MODEL.py.")
@click.option("--inputs-entry", default=None, help="Name of the example inputs (or their factory) in MODEL.py.")
@click.option("--dynamic", multiple=True, help="input:axis:label:min:max, e.g. x:0:batch:1:256 (repeatable).")
@click.option(
    "--precision", type=click.Choice(["fp32", "bf16", "fp16", "tf32"]), default="fp32", show_default=True,
    help="bf16/fp16: the model in that type, fp32 accumulation; tf32: fp32 with TF32 GPU matmuls (opt-in).",
)
@click.option("--no-selftest", is_flag=True, help="Do not store example inputs and eager outputs.")
@click.option("--tune", is_flag=True, help="Benchmark matmul/conv tile configs on this machine's GPU (cached).")
def build(
    *,
    model: Path,
    out: Path,
    targets: tuple[str, ...],
    entry: str | None,
    inputs_entry: str | None,
    dynamic: tuple[str, ...],
    precision: str,
    no_selftest: bool,
    tune: bool,
) -> None:
    """Build MODEL.py into a package (needs the builder: pip install 'aotc[build]')."""
    with _errors():
        if not model.is_file():
            raise UsageError(f"{model} does not exist")
        try:
            from aotc_build.build import build as run_build
            from aotc_build.options import BuildOptions, parse_target
        except ImportError as e:
            # Only a missing builder or build dependency is the user's to fix; anything else is a bug.
            if (e.name or "").split(".")[0] not in _BUILD_DEPS and e.name != "aotc_build.build":
                raise
            raise UsageError(f"`aotc build` needs the builder and torch ({e}): pip install 'aotc[build]'") from None
        kwargs: dict[str, Any] = {"precision": precision, "dynamic": dynamic, "selftest": not no_selftest, "tune": tune}
        names = [t for group in targets for t in group.split(",") if t.strip()]
        if names:
            kwargs["targets"] = tuple(parse_target(t) for t in names)
        cache = os.environ.get("AOTC_CACHE_DIR")  # the one place the environment is read
        report = run_build(model, out, BuildOptions(**kwargs), entry, inputs_entry, Path(cache) if cache else None)
        summary = f" ({report.kernels} kernels; targets {', '.join(report.targets)})" if report is not None else ""
        click.echo(f"wrote {out}{summary}")
        if report is not None and report.seconds:
            click.echo(f"  in {report.timing()}")


def _load_input(spec: str, model: Model) -> tuple[str, np.ndarray]:
    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise UsageError(f"--input {spec!r}: use NAME=FILE.npy")
    try:
        arr = np.load(file, allow_pickle=False)  # never unpickle user files
    except (OSError, ValueError) as e:
        raise UsageError(f"--input {name}: cannot read {file} as a .npy file: {e}") from None
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"--input {name}: {file} is an .npz archive; pass one .npy file per input")
    want = next((s for s in model.inputs if s.name == name), None)
    if want is not None and want.dtype == "bfloat16" and arr.dtype == np.dtype("V2"):
        import ml_dtypes  # .npy stores bfloat16 as raw 2-byte voids

        arr = arr.view(ml_dtypes.bfloat16)
    return name, arr


@cli.command(epilog=_EPILOG)
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, help="NAME=FILE.npy, one per model input.")
@click.option(
    "--output",
    "-o",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write outputs to this .npz (bfloat16 is stored as raw 2-byte values).",
)
@click.option("--threads", type=int, default=None, help="CPU threads (default: OpenMP's).")
@_device_option
def run(package: Path, inputs: tuple[str, ...], out: Path | None, threads: int | None, device: str) -> None:
    """Run PACKAGE on .npy inputs; print each output's name, shape and dtype."""
    with _errors():
        model = load(package, device=device, num_threads=threads)
        feeds: dict[str, np.ndarray] = {}
        for spec in inputs:
            name, arr = _load_input(spec, model)
            if name in feeds:
                raise InputMismatch(f"input {name!r} given twice")
            feeds[name] = arr
        results = {k: model.executor.to_host(v) for k, v in model.run(feeds).items()}
        if model.fallback:
            click.echo(f"note: CUDA not used: {model.fallback}", err=True)
        for name, arr in results.items():
            click.echo(f"{name}: {arr.dtype.name}{list(arr.shape)}")
        if out is not None:
            np.savez(out, **results)  # type: ignore[arg-type]
            click.echo(f"wrote {out}")


@cli.command(epilog=_EPILOG)
@click.argument("package", type=click.Path(path_type=Path))
@_device_option
def verify(package: Path, device: str) -> None:
    """Run PACKAGE's self-test here and compare with the eager outputs recorded at build time."""
    with _errors():
        model = load(package, device=device)
        st = model.manifest.selftest
        checks = model.verify()
        assert st is not None  # verify() refuses packages without one
        if model.fallback:
            click.echo(f"note: CUDA not used: {model.fallback}", err=True)
        click.echo(f"self-test on {model.target} (rtol={st.rtol:g}, atol={st.atol:g})")
        for c in checks:
            status = "ok" if c.ok else "FAIL"
            note = f"  ({c.note})" if c.note else ""
            click.echo(f"  {status:4} {c.name}: max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g}{note}")
        bad = [c.name for c in checks if not c.ok]
        if bad:
            raise VerifyFailed(f"outputs {', '.join(bad)} differ from the eager outputs beyond rtol={st.rtol:g}, atol={st.atol:g}")


@cli.command(epilog=_EPILOG)
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and member status as JSON.")
def inspect(package: Path, as_json: bool) -> None:
    """Show what PACKAGE holds and check every member's sha256 (exit 3 if any mismatches)."""
    with _errors():
        pkg = Package(package)
        m = pkg.manifest
        status = {name: ("ok" if pkg.check(name) else "MISMATCH") for name in m.members}
        if as_json:
            click.echo(
                json.dumps(
                    {"manifest": to_dict(m), "member_status": status, "size": pkg.size},
                    indent=1,
                    sort_keys=True,
                )
            )
        else:
            _print_inspect(pkg, status)
        bad = [n for n, s in status.items() if s != "ok"]
        if bad:
            raise PackageCorrupt(f"{package}: sha256 mismatch in {', '.join(bad)}; copy it again or rebuild it")


def _print_inspect(pkg: Package, status: dict[str, str]) -> None:
    m = pkg.manifest
    echo = click.echo
    echo(f"package   {pkg.path} ({pkg.size:,} bytes)")
    echo(f"format    aotc format version {m.format_version}")
    echo(f"model     {m.model.name} (source sha256 {m.model.source_sha256[:16]}…)")
    echo("build     " + ", ".join(f"{k} {v}" for k, v in m.build.items()))
    for s in m.symbols:
        echo(f"symbol    {s.label} ({s.name}) in [{s.min}, {'inf' if s.max is None else s.max}]")
    for t in m.inputs:
        echo(f"input     {t.name}: {m.describe(t)}")
    for t in m.outputs:
        echo(f"output    {t.name}: {m.describe(t)}")
    for tg in m.targets:
        if isinstance(tg, CpuTarget):
            echo(
                f"target    cpu:{tg.level}  {tg.library}, {len(tg.kernels)} kernels, "
                f"arena {m.pretty(tg.arena_bytes)} bytes, abi {tg.abi_version}, {tg.compiler}"
                + (f", glibc >= {tg.min_glibc}" if tg.min_glibc else "")
                + (f", {len(tg.packed.tensors)} packed weights in {tg.packed.member}" if tg.packed else "")
            )
        else:
            echo(
                f"target    cuda:{tg.arch}  {len(tg.kernels)} kernels, {len(tg.launches)} launches, "
                f"arena {m.pretty(tg.arena_bytes)} bytes, {tg.precision}, triton {tg.triton_version}, "
                f"ptxas {tg.ptxas_version}, driver >= {tg.min_driver // 1000}.{tg.min_driver % 1000 // 10}"
            )
            for k in tg.kernels:
                echo(f"  kernel  {k.name}  {k.member}, {k.num_warps} warps, {k.shared:,} bytes shared")
    nbytes = sum(math.prod(int(d) for d in t.shape) * ITEMSIZE[t.dtype] for t in m.weights.tensors)
    echo(f"weights   {len(m.weights.tensors)} tensors, {nbytes:,} bytes in {m.weights.member}")
    st = m.selftest
    echo("selftest  " + ("none" if st is None else f"{st.member} (rtol={st.rtol:g}, atol={st.atol:g})"))
    for name, mem in m.members.items():
        echo(f"member    {status[name]:8} {name}  {mem.size:,} bytes  sha256 {mem.sha256[:16]}…")


cli.add_command(serve_command)  # aotc.serve imports its server libraries only when the command runs


def main() -> None:
    cli(prog_name="aotc")
