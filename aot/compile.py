"""Native compilation: generated C++ -> a shared library (bytes), through the system g++, with a
content-addressed cache. (Triton -> cubin lives with the Triton code generator.)

What it is: the one place that knows g++ flags. What it is not: a build system -- one translation unit,
one command, no incremental state beyond the cache.

Note (flags): ``-O3 -march=<level>`` for the package's CPU level (``-mprefer-vector-width=512`` on
x86-64-v4, where 512-bit vectors pay on the server parts that have them); ``-fopenmp``; and, for
numerics, ``-ffp-contract=off -fno-math-errno -fno-trapping-math`` but *not* ``-ffast-math``:
  - ``-ffp-contract=off`` keeps ``a * b + c`` two roundings, as eager torch computes pointwise math, so
    fp32 outputs match eager to ~1 ulp per op instead of drifting where results cancel; the matmul/conv
    micro-kernels use explicit FMA intrinsics, so dot products still get full FMA throughput;
  - ``-fno-math-errno`` lets sqrt and friends inline as instructions (nothing reads errno);
  - ``-fno-trapping-math`` lets the vectoriser if-convert masked loop bodies (nothing traps on FP
    exceptions); neither changes any result. NaN/inf semantics stay IEEE (no -ffinite-math-only).
``-static-libstdc++ -static-libgcc`` so the .so needs nothing newer than the target's glibc; libgomp
stays dynamic (its thread pool must be the process's one) and is recorded in ``needed``.

Note (determinism): the build runs in ``<tmp>/aotc-build/<key>/model.cpp`` with ``-frandom-seed=<key>``
and ``-ffile-prefix-map``, no ``-g``, and no timestamps in the source, so the same source and flags
give a byte-identical .so (tests build twice and compare).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aotc.errors import CompileError

from .options import BuildOptions, Target

CXX = "g++"
COMMON_FLAGS = (
    "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-fvisibility=hidden",
    "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
    "-static-libstdc++", "-static-libgcc", "-Wl,--exclude-libs,ALL", "-Wl,--build-id=sha1",
)  # fmt: skip
MAX_ERROR_LINES = 40


@dataclass(frozen=True)
class CompiledLibrary:
    so_bytes: bytes
    command: tuple[str, ...]  # the exact compiler command (build paths are fixed per cache key)
    compiler_version: str  # first line of ``g++ --version``
    flags: tuple[str, ...]  # the flags that shape the code (also part of the cache key)
    needed: tuple[str, ...] = ()  # shared libraries the .so loads (DT_NEEDED), e.g. libgomp.so.1
    key: str = ""  # the cache key: sha256 of source, flags, compiler and template headers
    min_glibc: str = ""  # the newest GLIBC_x.y symbol version the .so needs (the target's glibc must have it)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.so_bytes).hexdigest()


def templates_dir() -> Path:
    """The directory holding aotc_abi.h and the kernel templates (installed as package data)."""
    return Path(str(resources.files("aotc_build.cpp_templates")))


def target_flags(target: Target, options: BuildOptions) -> tuple[str, ...]:
    if target.kind != "cpu":
        raise ValueError(f"compile_cpp: target {target} is not a CPU target")
    flags = [options.opt_level, f"-march={target.arch}"]
    if target.arch == "x86-64-v4":
        flags.append("-mprefer-vector-width=512")
    return (*flags, *COMMON_FLAGS)


@functools.lru_cache(maxsize=8)
def compiler_version(cxx: str = CXX) -> str:
    exe = shutil.which(cxx)
    if exe is None:
        raise CompileError(f"the C++ compiler {cxx!r} is not on PATH: install g++ (e.g. apt-get install g++)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].strip() if out.stdout else cxx


def _templates_digest() -> str:
    h = hashlib.sha256()
    d = templates_dir()
    for p in sorted(d.iterdir()):
        if p.suffix in (".h", ".cpp"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str, flags: tuple[str, ...], version: str) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), version, _templates_digest()):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def _readelf(flag: str, path: Path) -> str:
    exe = shutil.which("readelf")
    if exe is None:
        return ""
    return subprocess.run([exe, flag, str(path)], capture_output=True, text=True, check=False).stdout


def _linkage(path: Path) -> tuple[tuple[str, ...], str]:
    """DT_NEEDED entries and the newest GLIBC_ symbol version of an ELF shared object (via readelf;
    empty when binutils is missing)."""
    needed = tuple(line.split("[", 1)[1].split("]", 1)[0] for line in _readelf("-d", path).splitlines() if "(NEEDED)" in line)
    versions = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", _readelf("-V", path))}
    glibc = ".".join(map(str, max(versions))) if versions else ""
    return needed, glibc


def compile_cpp(source: str, target: Target, options: BuildOptions, cache_dir: Path | None = None) -> CompiledLibrary:
    """Compile one generated translation unit into a shared library for ``target``.

    With ``cache_dir``, a library built before from the same source, flags, compiler and templates is
    returned from there. On failure raises CompileError naming the kept source file and the command."""
    version = compiler_version()
    flags = target_flags(target, options)
    key = cache_key(source, flags, version)
    cached = Path(cache_dir) / "cpp" / f"{key}.so" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        needed, glibc = _linkage(cached)
        return CompiledLibrary(cached.read_bytes(), _command(key, flags), version, flags, needed, key, glibc)

    build = _build_dir(key)
    build.mkdir(parents=True, exist_ok=True)
    with open(build / ".lock", "w") as lock:  # one build per key at a time; the dir is kept
        fcntl.flock(lock, fcntl.LOCK_EX)
        src, out = build / "model.cpp", build / "model.so"
        src.write_text(source)
        cmd = _command(key, flags)
        proc = run_tied(cmd, cwd=build)
        if proc.returncode != 0 or not out.is_file():
            errors = [ln for ln in proc.stderr.splitlines() if ln.strip()][:MAX_ERROR_LINES]
            raise CompileError(
                f"g++ failed (exit {proc.returncode}) compiling the generated C++ kept at {src}\n"
                f"command: {shlex.join(cmd)}\n" + "\n".join(errors)
            )
        so = out.read_bytes()
        needed, glibc = _linkage(out)
        src.unlink()
        out.unlink()
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(so)
        os.replace(tmp, cached)
    return CompiledLibrary(so, cmd, version, flags, needed, key, glibc)


# The compiler runs under `sh` in a process group of its own, beside a watcher that waits for EOF on a pipe
# whose write end only this process holds: when this process ends in any way (kill -9 included), the
# kernel closes that end and the watcher kills the whole group (g++, cc1plus, as, ld), so no compiler
# outlives the build. No preexec_fn (unsafe with threads) and no race: a parent already gone is EOF at once.
_TIED = 'w=$1; shift; (read _ <&"$w"; kill -KILL 0) & watcher=$!; "$@" & wait $!; rc=$?; kill "$watcher" 2>/dev/null; exit $rc'


def run_tied(cmd: tuple[str, ...] | list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd)`` (output captured, text) whose process tree dies with this process."""
    r, w = os.pipe()  # both ends close-on-exec: only the read end is passed on, to the watcher
    try:
        return subprocess.run(
            ["sh", "-c", _TIED, "sh", str(r), *cmd], capture_output=True, text=True, check=False, cwd=cwd,
            pass_fds=(r,), start_new_session=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        os.close(r)
        os.close(w)  # the watcher sees EOF and kills what is left of the group (nothing, normally)


def _build_dir(key: str) -> Path:
    return Path(tempfile.gettempdir()) / "aotc-build" / key[:32]


def _command(key: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    build = _build_dir(key)
    return (
        CXX, *flags, f"-frandom-seed={key[:16]}", f"-ffile-prefix-map={build}=.",
        f"-I{templates_dir()}", str(build / "model.cpp"), "-o", str(build / "model.so"),
    )  # fmt: skip
