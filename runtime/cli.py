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
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from . import __version__, inspect_view
from .cli_group import Group, trust_options, trusted_keys
from .cli_group import refusals as _errors
from .errors import EXIT_CODES, InputMismatch, PackageCorrupt, UntrustedPackage, UsageError, VerifyFailed
from .loading import load
from .model import Model
from .package import Package
from .schema import FORMAT_VERSION, to_dict
from .serve.cli import serve as serve_command

F = TypeVar("F", bound=Callable[..., Any])

_EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code}  {name}" for name, code in sorted(EXIT_CODES.items(), key=lambda kv: kv[1]))


def _device_option(f: F) -> F:
    return click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")(f)


@click.group(cls=Group, epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aotc", message=f"%(prog)s %(version)s (package format version {FORMAT_VERSION})")
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
@click.option("--no-winograd", is_flag=True, help="CPU 3x3 convs: the direct kernel only (~10x smaller fp32 error, slower).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the result line (progress is shown on a terminal only).")
@click.option("-v", "--verbose", is_flag=True, help="Show torch's warnings and messages and the fusion log.")
@click.option("--keep-sources", type=click.Path(path_type=Path), default=None, help="Write the generated C++ and Triton here.")
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
    no_winograd: bool,
    quiet: bool,
    verbose: bool,
    keep_sources: Path | None,
) -> None:
    """Build MODEL (a model.py, or an ONNX file) into a package (needs the builder: pip install 'aotc[build]')."""
    with _errors():
        from aotc_build.cli_build import BuildRequest
        from aotc_build.cli_build import run as run_build

        cache = os.environ.get("AOTC_CACHE_DIR")  # the one place the environment is read
        req = BuildRequest(
            model, out, targets, entry, inputs_entry, dynamic, precision, not no_selftest, tune, quiet, verbose, keep_sources,
            Path(cache) if cache else None, not no_winograd,
        )  # fmt: skip
        run_build(req, click.echo)


def _read_npy(name: str, file: str) -> np.ndarray:
    """A .npy file whose header is checked against the file's size before anything is allocated: a header
    may claim any shape. No pickles, no object arrays, regular files only (a FIFO would hang)."""

    def bad(what: str) -> UsageError:
        return UsageError(f"--input {name}: cannot read {file} as a .npy file: {what}")

    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as e:
        raise bad(getattr(e, "strerror", None) or str(e)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise bad("not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version[0]}.{version[1]} (this reads 1.0 and 2.0)")
            if dtype.hasobject:
                raise ValueError("it holds Python objects, which would need unpickling")
            want = math.prod(shape) * dtype.itemsize
            have = st.st_size - f.tell()
            if want != have:
                raise ValueError(f"its header says {dtype}{list(shape)} ({want:,} bytes), the file holds {have:,}")
            data = f.read(have)
        except (ValueError, OSError, EOFError, SyntaxError, TypeError, OverflowError) as e:
            raise bad(str(e)[:300] or type(e).__name__) from None
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")


def _check_output(out: Path) -> None:
    """Refuse an --output that cannot be written before the model runs, not after."""
    if out.is_dir():
        raise UsageError(f"--output {out} is a directory; name the .npz file to write")
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(f"--output {out}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {out}: the folder {folder} is not writable")


def _write_npz(out: Path, arrays: dict[str, np.ndarray]) -> None:
    """Exactly ``out`` (np.savez would add .npz to a name without it), whole or not at all: written beside
    it under a temporary name, then renamed over it."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        raise UsageError(f"--output {out}: cannot write it: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _load_input(spec: str, model: Model) -> tuple[str, np.ndarray]:
    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise UsageError(f"--input {spec!r}: use NAME=FILE.npy")
    arr = _read_npy(name, file)
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
    type=click.Path(path_type=Path),  # checked by _check_output, in one line, before the model runs
    help="Write outputs to exactly this file, as .npz (bfloat16 is stored as raw 2-byte values).",
)
@click.option("--threads", type=int, default=None, help="CPU threads (default: OpenMP's).")
@click.option("--cast", is_flag=True, help="Convert inputs to the package's dtypes (e.g. float32 to bfloat16).")
@_device_option
@trust_options
def run(
    package: Path, inputs: tuple[str, ...], out: Path | None, threads: int | None, cast: bool, device: str,
    trusted_key: tuple[str, ...], require_signature: bool,
) -> None:  # fmt: skip
    """Run PACKAGE on .npy inputs; print each output's name, shape and dtype."""
    with _errors():
        keys = trusted_keys(require_signature, trusted_key)
        if out is not None:
            _check_output(out)
        model = load(package, device=device, num_threads=threads, trusted_keys=keys)
        feeds: dict[str, np.ndarray] = {}
        for spec in inputs:
            name, arr = _load_input(spec, model)
            if name in feeds:
                raise InputMismatch(f"input {name!r} given twice")
            feeds[name] = arr
        from .bench import file_feeds

        feeds = file_feeds(model, feeds, cast)
        results = {k: model.executor.to_host(v) for k, v in model.run(feeds).items()}
        _notes(model)
        for name, arr in results.items():
            click.echo(f"{name}: {arr.dtype.name}{list(arr.shape)}")
        if out is not None:
            _write_npz(out, results)
            click.echo(f"wrote {out}")


def _notes(model: Model) -> None:
    if model.fallback:
        click.echo(f"note: CUDA not used: {model.fallback}", err=True)
    jit = getattr(model.executor, "note", None)  # CUDA through the driver's JIT (aotc.cuda_ptx)
    if jit:
        click.echo(f"note: {jit}", err=True)


@cli.command(epilog=_EPILOG)
@click.argument("package", type=click.Path(path_type=Path))
@_device_option
@trust_options
def verify(package: Path, device: str, trusted_key: tuple[str, ...], require_signature: bool) -> None:
    """Run PACKAGE's self-test here and compare with the eager outputs recorded at build time."""
    with _errors():
        model = load(package, device=device, trusted_keys=trusted_keys(require_signature, trusted_key))
        st = model.manifest.selftest
        checks = model.verify()
        assert st is not None  # verify() refuses packages without one
        _notes(model)
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
@trust_options
def inspect(package: Path, as_json: bool, trusted_key: tuple[str, ...], require_signature: bool) -> None:
    """Show what PACKAGE holds, its signature, and check every member's sha256 (exit 3 if any mismatches,
    10 if its signature does not match it)."""
    with _errors():
        keys = trusted_keys(require_signature, trusted_key)
        trusted = None
        if keys is not None:
            from .signing import public_keys

            trusted = public_keys(keys)
        pkg = Package(package, trusted)
        m = pkg.manifest
        status = {name: ("ok" if pkg.check(name) else "MISMATCH") for name in m.members}
        signature, forged = _signature_state(pkg, trusted or ())
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "manifest": to_dict(m),
                        "member_status": status,
                        "signature": signature,
                        "size": pkg.size,
                        "summary": inspect_view.summary(pkg),
                    },
                    indent=1,
                    sort_keys=True,
                )
            )
        else:
            for line in inspect_view.lines(pkg, status):
                click.echo(line)
            click.echo(f"signature: {signature}")
        bad = [n for n, s in status.items() if s != "ok"]
        if bad:
            raise PackageCorrupt(f"{package}: sha256 mismatch in {', '.join(bad)}; copy it again or rebuild it")
        if forged:
            raise UntrustedPackage(f"{package}: signature {signature}")


def _signature_state(pkg: Package, trusted: tuple[Any, ...]) -> tuple[str, bool]:
    from . import signing
    from .schema import MANIFEST

    e = pkg.entries[MANIFEST]
    return signing.describe(pkg._mm, signing.ranges(pkg.entries), pkg._mm[e.offset : e.offset + e.size], trusted)


@cli.command(epilog=_EPILOG)
@click.argument("key", type=click.Path(dir_okay=False, path_type=Path))
def keygen(key: Path) -> None:
    """Make an ed25519 key pair for signing packages: KEY (private, mode 0600) and KEY.pub (give this one to
    the machines that run the packages). Needs pip install 'aotc[sign]'."""
    with _errors():
        from .signing import keygen as make_key

        pub = make_key(key)
        click.echo(f"wrote {key} (private: keep it secret) and {key}.pub (public), key id {pub.key_id}")


@cli.command(epilog=_EPILOG)
@click.argument("package", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The private key (aotc keygen).")
@click.option(
    "-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write the signed package here (default: in place)."
)
def sign(package: Path, key: Path, out: Path | None) -> None:
    """Sign PACKAGE with KEY (ed25519): checks every member's hash first, then adds a signature over the
    manifest and the ZIP records, replacing any signature it had. Needs pip install 'aotc[sign]'."""
    with _errors():
        from .signing import sign as sign_package

        pub = sign_package(package, key, out)
        click.echo(f"signed {out or package} with key {pub.key_id}")


def _more_commands() -> None:
    from .bench import bench
    from .doctor import doctor

    cli.add_command(bench)
    cli.add_command(doctor)


_more_commands()


cli.add_command(serve_command)  # aotc.serve imports its server libraries only when the command runs


def main() -> None:
    """The console entry: click's own errors as click prints them (exit 2); Ctrl-C anywhere in a command,
    click's parsing included, one line and exit 130 instead of click's "Aborted!" and exit 1."""
    try:
        rv = cli.main(prog_name="aotc", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aotc: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
