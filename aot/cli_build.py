"""``aotc build`` behind the click command: flags checked first, then the builder, quiet unless asked.

What it is: the order a user's build runs in. Every flag and path is checked before torch is imported
(``flags.py``), then the builder runs with torch's noise kept off the terminal (``progress.hush``) and a
live progress line when stderr is a terminal. What it is not: the CLI's parsing (``aotc/cli.py``) or the
pipeline (``build.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotc.cpu_features import LEVELS
from aotc.errors import UsageError

from .flags import check_dynamic, check_model_file, check_output, check_sources_dir
from .options import BuildOptions, native_cpu_level, parse_target

_BUILD_DEPS = {"aotc_build", "torch", "triton", "sympy", "safetensors", "jinja2", "onnx"}


@dataclass(frozen=True)
class BuildRequest:
    model: Path
    out: Path
    targets: tuple[str, ...] = ()
    entry: str | None = None
    inputs_entry: str | None = None
    dynamic: tuple[str, ...] = ()
    precision: str = "fp32"
    selftest: bool = True
    tune: bool = False
    quiet: bool = False
    verbose: bool = False
    keep_sources: Path | None = None
    cache_dir: Path | None = None
    winograd: bool = True


def check(req: BuildRequest) -> list[Any]:
    """Every check that needs no model: one UsageError line each. Returns the parsed targets."""
    check_model_file(req.model)
    check_output(req.out)
    check_dynamic(req.dynamic)
    if req.keep_sources is not None:
        check_sources_dir(req.keep_sources)
    if req.quiet and req.verbose:
        raise UsageError("--quiet and --verbose contradict each other; pass one")
    names = [t for group in req.targets for t in group.split(",") if t.strip()]
    if any(not t.strip() for group in req.targets for t in group.split(",")) and not names:
        raise UsageError("--target is empty: use cpu[:level] or cuda:sm_NN")
    return [parse_target(t) for t in names]


def run(req: BuildRequest, echo: Any) -> None:
    """Check, build, print the summary through ``echo`` (click.echo)."""
    targets = check(req)
    try:
        from .build import build
        from .progress import Progress, RichProgress, hush
    except ImportError as e:
        # Only a missing builder or build dependency is the user's to fix; anything else is a bug.
        if (e.name or "").split(".")[0] not in _BUILD_DEPS:
            raise
        raise UsageError(f"`aotc build` needs the builder and torch ({e}): pip install 'aotc[build]'") from None
    kwargs: dict[str, Any] = {"precision": req.precision, "dynamic": req.dynamic, "selftest": req.selftest, "tune": req.tune,
              "winograd": req.winograd}
    if targets:
        kwargs["targets"] = tuple(targets)
    options = BuildOptions(**kwargs)
    with hush(req.verbose) as stream:
        show = not req.quiet and (req.verbose or stream.isatty())
        progress = RichProgress(stream) if show and stream.isatty() else Progress()
        try:
            report = build(
                req.model, req.out, options, req.entry, req.inputs_entry, req.cache_dir,
                progress=progress, sources_dir=req.keep_sources,
            )  # fmt: skip
        finally:
            progress.close()
    summary = f" ({report.kernels} kernels; targets {', '.join(report.targets)})" if report is not None else ""
    echo(f"wrote {req.out}{summary}")
    if report is not None and report.seconds and not req.quiet:
        echo(f"  in {report.timing()}")
    if req.keep_sources is not None and not req.quiet:
        echo(f"  sources in {req.keep_sources}")
    if report is not None and not targets and not req.quiet:
        hint = _portable_default_hint(options)
        if hint:
            echo(hint)


def _portable_default_hint(options: BuildOptions) -> str | None:
    """A note when the default (portable) CPU level is below this machine's: a package built without
    --target runs AVX2 code on an AVX-512 server, where ONNX Runtime and torch pick AVX-512 at run time."""
    level = next((t.arch for t in options.targets if t.kind == "cpu"), None)
    native = native_cpu_level()
    if level is None or LEVELS.index(native) <= LEVELS.index(level):
        return None
    return (f"  note: built for cpu:{level}, the portable default; this machine runs {native}: "
            f"--target cpu:native (or cpu:{native}) runs faster here and on machines like it")
