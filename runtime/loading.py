"""``aotc.load``: open a package, check it, and pick the device, with the package's hashing started first.

What it is: ``load`` (device and target choice; see its docstring) and ``verify_for_load``. This module
imports only the standard library and ``aotc.container`` at import; ``load`` maps the package and starts
hashing its members on the cores but one (``aotc.container.Container(hash_ahead=True)``), and only then
imports the schema, parses the manifest and prepares the executor, while the hashing runs. Every digest is
compared with the manifest's (``verify_for_load``) before any code reaches dlopen or the driver.
What it is not: ``Model`` (``aotc.model``), which checks inputs and runs.

Note (why): in a cold start of the MLP of benchmarks/cpu_side_by_side.py (100 MB of weights, ~100 ms of
sha256 on one core of the 2-core dev machine) the main thread spends ~30 ms importing and parsing before
it can ask for a digest; hashing meanwhile takes that much off the end where a second core is free.
Measured there (shared, 20 runs interleaved): load 136 -> 131 ms median, 122 with HANDOFF_S.

Note (numpy's BLAS threads): a script that calls ``aotc.load`` before it imports numpy lets the hashing run
beside numpy's import, the largest part of a cold start after the hashing. pip's numpy brings OpenBLAS,
whose worker threads start when it loads and spin ~0.1 s (2**28 cycles) waiting for work that never comes
here: 55-90 ms of CPU taken from the hashing on a 2-core machine. When this load is the one that imports
numpy, it sets OPENBLAS_THREAD_TIMEOUT for that import only (OpenBLAS reads it once, as it loads): the
workers then sleep at once and wake when numpy first calls BLAS. numpy's BLAS keeps all its threads; a user's
own OPENBLAS_THREAD_TIMEOUT (or GOTO_THREAD_TIMEOUT) wins, and a numpy imported before ``aotc.load`` is
left as it is. Measured (MLP, 2 shared cores, aotc.load before numpy, 15 runs interleaved): 164 -> 135 ms
idle from this alone (benchmarks/results/cold_start_2026-12-03_session9.json has the whole session's).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from .container import Container
from .errors import IncompatiblePackage, UsageError

TYPE_CHECKING = False  # not typing's: this module is on the way to the hashing's start (see aotc.container)

if TYPE_CHECKING:
    from .model import Executor, Model
    from .package import Package

# OpenBLAS's spin before its idle workers sleep, as a power of two of cycles: 4 is its smallest (~0).
BLAS_THREAD_TIMEOUT = "4"
BLAS_TIMEOUT_VARS = ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")

# How long a hashing thread that finished a chunk may wait for the GIL while this thread imports and parses
# (Python's default switch interval is 5 ms, most of an 8 MiB chunk's ~8 ms of hashing); set while a load
# hashes. Measured (MLP, 100 MB of weights, 2 cores, 20 runs interleaved): load 131 ms with the default, 122.
HANDOFF_S = 0.0005


def load(
    path: str | Path,
    device: str = "auto",
    num_threads: int | None = None,
    trusted_keys: Sequence[str | os.PathLike[str] | bytes] | None = None,
) -> Model:
    """Open a package and prepare it to run.

    device: "auto" (CUDA when the package has a target for this GPU and the driver loads, else CPU),
    "cpu", "cuda" or "cuda:N". num_threads: at most this many threads per call on the CPU target (None:
    every core), fewer while other processes keep cores busy. trusted_keys: public key files (or PEM
    bytes); when given, the package must be signed by one of them (``aotc sign``), else UntrustedPackage
    before its manifest is read (needs ``pip install 'aotc[sign]'``).
    """
    if not isinstance(path, str | os.PathLike):
        raise UsageError(f"aotc.load takes a package path (str or os.PathLike), got {type(path).__name__}")
    if not isinstance(device, str):
        raise UsageError(f"device must be a string (auto, cpu, cuda or cuda:N), got {type(device).__name__}")
    dev = device.strip().lower()
    if dev not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", dev):
        raise UsageError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")
    if num_threads is not None and (not isinstance(num_threads, int) or isinstance(num_threads, bool)):
        raise UsageError(f"num_threads must be an int or None, got {type(num_threads).__name__} {num_threads!r}")
    keys = None
    if trusted_keys is not None:
        from .signing import public_keys

        keys = public_keys(trusted_keys)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, HANDOFF_S))
    try:
        container = Container(path, hash_ahead=True)  # hashing runs from here on, beside the imports below
        try:
            import_numpy()
            from .model import Model
            from .package import Package

            package = Package(path, keys, container)
            m = package.manifest
            verify_for_load(package)  # every hash this load may rely on, before any code is loaded
        except BaseException:
            container.hashes.close()  # a refused package: its hashing stops rather than running on
            raise
    finally:
        sys.setswitchinterval(switch)
    fallback = None
    if dev.startswith("cuda") or (dev == "auto" and m.cuda_targets):
        try:
            return Model(package, _open_cuda(package, "cuda" if dev == "auto" else dev))
        except IncompatiblePackage as e:
            if dev != "auto" or not m.cpu_targets:
                raise
            fallback = str(e)
    from .cpu import CpuExecutor, select_target

    try:
        target = select_target(m.cpu_targets)
    except IncompatiblePackage as e:
        if fallback is None:
            raise
        raise IncompatiblePackage(f"{e}; and the CUDA targets cannot run either: {fallback}") from None
    return Model(package, CpuExecutor(package, target, num_threads=num_threads), fallback)


def import_numpy() -> None:
    """Import numpy, with numpy's OpenBLAS told not to spin its idle threads when this is the first import
    and the environment says nothing about it (see the module's note)."""
    quiet = "numpy" not in sys.modules and not any(v in os.environ for v in BLAS_TIMEOUT_VARS)
    if quiet:
        os.environ[BLAS_TIMEOUT_VARS[0]] = BLAS_THREAD_TIMEOUT
    try:
        import numpy  # noqa: F401
    finally:
        if quiet:
            os.environ.pop(BLAS_TIMEOUT_VARS[0], None)


def verify_for_load(package: Package) -> None:
    """Check the hashes of every member a load may use, before any code object reaches dlopen or the driver:
    all of them but the packed weights of CPU targets this CPU will not pick (each is the size of the
    weights, and only its own target reads it)."""
    from .cpu import select_target

    m = package.manifest
    try:
        pick = select_target(m.cpu_targets) if m.cpu_targets else None
    except IncompatiblePackage:
        pick = None
    skip = {t.packed.member for t in m.cpu_targets if t.packed is not None and t is not pick}
    package.verify_members((n for n in m.members if n not in skip), drop_others=True)


def _open_cuda(package: Package, device: str) -> Executor:
    if not package.manifest.cuda_targets:
        have = ", ".join(f"cpu:{t.level}" for t in package.manifest.cpu_targets) or "none"
        raise IncompatiblePackage(f"the package has no CUDA target (it has: {have}): rebuild with --target cuda:sm_NN, or use device='cpu'")
    try:
        cuda = importlib.import_module("aotc.cuda")  # only packages with a CUDA target pay for it
    except ImportError as e:
        raise IncompatiblePackage(f"this aotc runtime cannot run CUDA targets ({e}); use device='cpu'") from None
    try:
        ex: Executor = cuda.open_executor(package, device)
    except OSError as e:
        raise IncompatiblePackage(
            f"cannot use the CUDA driver ({e}): install the NVIDIA driver (libcuda.so.1), or use device='cpu'"
        ) from None
    return ex
