"""``aotc doctor``: what this machine can run and build, and what to do about each missing piece.

What it is: one line per fact (CPU level and the flags kernels use, OpenMP, the compiler for builds,
libcuda with its driver version and each GPU's arch, torch/triton versions, the kernel cache directory),
each marked ok / missing / note, with a ``fix:`` for the missing ones; ``--json`` the same as data.
What it is not: a check of a package (``aotc verify`` and ``aotc inspect`` do that). It imports neither
torch nor triton (versions come from package metadata), so it answers in well under a second.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import click

from . import __version__
from .cli_group import refusals
from .cpu_features import LEVEL_FEATURES, cpu_flags, cpu_level, missing_features
from .schema import FORMAT_VERSION

# Flags the generated kernels use beyond the x86-64 levels: bf16 dot products, AMX tiles, VNNI.
_EXTRA_FLAGS = ("avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


@dataclass
class Check:
    what: str
    status: str  # "ok", "missing" or "note"
    detail: str
    fix: str = ""


def _cpu() -> list[Check]:
    flags = cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64"):
        return [
            Check("cpu", "missing", f"{platform.machine()}: aotc's CPU targets are x86-64 only", "run CPU packages on an x86-64 machine")
        ]
    level = cpu_level()
    model = _cpu_model()
    out = [Check("cpu", "ok", f"{model}, {os.cpu_count()} cores, level {level} (packages built for cpu:{level} or lower run here)")]
    lacking = missing_features(LEVEL_FEATURES["x86-64-v3"], flags)
    if lacking:
        out.append(
            Check(
                "cpu level", "note", f"below x86-64-v3 (lacks {', '.join(lacking)})", "build with --target cpu:x86-64-v2 for this machine"
            )
        )
    extra = [f for f in _EXTRA_FLAGS if f in flags]
    out.append(Check("cpu flags", "ok" if extra else "note", ", ".join(extra) or "no AVX-512 bf16/VNNI or AMX (bf16 runs slower)"))
    if "amx_bf16" in flags:
        out.append(_amx())
    return out


def _amx() -> Check:
    """Whether Linux lets processes use AMX tile data (bf16 matmuls run on it only then): ARCH_GET_XCOMP_SUPP
    lists the states the kernel supports (5.16 and later); asking changes nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        supp = ctypes.c_uint64(0)
        ok = libc.syscall(158, 0x1021, ctypes.byref(supp)) == 0  # SYS_arch_prctl, ARCH_GET_XCOMP_SUPP
    except (OSError, AttributeError):
        ok = False
    if ok and supp.value >> 18 & 1:
        return Check("amx", "ok", "tile data enabled by the kernel: bf16 matmuls run on AMX tiles")
    return Check("amx", "note", "the CPU has AMX but this Linux does not enable it (bf16 matmuls use AVX512_BF16)",
                 "Linux 5.16 or newer enables AMX")  # fmt: skip


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _openmp() -> Check:
    lib = ctypes.util.find_library("gomp")
    if lib:
        return Check("openmp", "ok", f"{lib} (the CPU libraries link libgomp)")
    return Check("openmp", "missing", "libgomp not found", "install the GCC OpenMP runtime (apt install libgomp1)")


def _compiler() -> Check:
    gxx = shutil.which("g++")
    if gxx is None:
        return Check(
            "compiler", "missing", "no g++ on PATH (needed to build CPU targets, not to run them)", "apt install g++ (version 9 or newer)"
        )
    first = subprocess.run([gxx, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()
    return Check("compiler", "ok", f"{first[0] if first else gxx} ({gxx})")


def _cuda() -> list[Check]:
    try:
        from . import cuda
    except ImportError as e:
        return [Check("cuda", "missing", f"the CUDA runtime module does not import ({e})", "reinstall aotc")]
    try:
        drv = cuda.driver()
        n = drv.device_count()
    except Exception as e:  # any failure here means "no usable GPU": say what it was
        if ctypes.util.find_library("cuda") is None:
            return [Check("cuda", "note", "no libcuda.so.1: CUDA targets cannot run here; CPU targets can",
                          "for GPUs: install the NVIDIA driver (it provides libcuda.so.1)")]  # fmt: skip
        return [Check("cuda", "missing", f"libcuda is present but does not initialise: {e}", "check `nvidia-smi` and the driver install")]
    major, minor = drv.version // 1000, drv.version % 1000 // 10
    out = [Check("cuda driver", "ok", f"CUDA {major}.{minor} driver (libcuda), {n} GPU(s)")]
    if n == 0:
        out.append(Check("gpu", "note", "no GPU visible (CUDA_VISIBLE_DEVICES?)", "unset CUDA_VISIBLE_DEVICES or check `nvidia-smi`"))
    for i in range(n):
        info = cuda.device_info(i)
        gib = info["total_mem"] / 2**30
        out.append(
            Check(
                f"gpu {i}",
                "ok",
                f"{info['name']}, {info['arch']}, {info['sm_count']} SMs, {gib:.0f} GiB: build with --target cuda:{info['arch']}",
            )
        )
    return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _builder() -> list[Check]:
    out = []
    for dist, need in (("torch", "2.11"), ("triton", "3.6")):
        v = _version(dist)
        if v is None:
            out.append(Check(dist, "note", "not installed: needed to build packages, not to run them", "pip install 'aotc[build]'"))
        else:
            old = tuple(int(p) for p in v.split("+")[0].split(".")[:2] if p.isdigit()) < tuple(int(p) for p in need.split("."))
            out.append(
                Check(dist, "missing" if old else "ok", v, f"aotc builds with {dist} >= {need}: pip install -U {dist}" if old else "")
            )
    return out


def _signing() -> Check:
    v = _version("cryptography")
    if v is None:
        return Check("signatures", "note", "cryptography not installed: signed packages cannot be checked or made here",
                     "pip install 'aotc[sign]'")  # fmt: skip
    return Check("signatures", "ok", f"cryptography {v}: aotc keygen/sign and --trusted-key work")


def _cache(env: str | None) -> Check:
    path = Path(env) if env else Path.home() / ".cache" / "aotc"
    origin = "AOTC_CACHE_DIR" if env else "default; set AOTC_CACHE_DIR to move it"
    probe = path if path.exists() else next((p for p in path.parents if p.exists()), Path("/"))
    if not os.access(probe, os.W_OK):
        return Check(
            "cache",
            "missing",
            f"{path} ({origin}) is not writable: builds recompile every kernel",
            "set AOTC_CACHE_DIR to a writable folder",
        )
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0
    return Check("cache", "ok", f"{path} ({origin}), {size / 2**20:.1f} MiB")


def diagnose(cache_env: str | None) -> list[Check]:
    runtime = Check("aotc", "ok", f"{__version__}, package format version {FORMAT_VERSION}, Python {platform.python_version()}")
    return [runtime, *_cpu(), _openmp(), *_cuda(), _compiler(), *_builder(), _signing(), _cache(cache_env)]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> None:
    """Check this machine: CPU, OpenMP, GPU driver, compiler, torch/triton, cache; say what to fix."""
    with refusals():
        checks = diagnose(os.environ.get("AOTC_CACHE_DIR"))  # the CLI reads the environment, nothing below it
        if as_json:
            click.echo(json.dumps([asdict(c) for c in checks], indent=1))
            return
        for c in checks:
            click.echo(f"{c.status:8} {c.what:12} {c.detail}")
            if c.fix:
                click.echo(f"{'':8} {'':12} fix: {c.fix}")
        missing = [c.what for c in checks if c.status == "missing"]
        click.echo(f"\n{len(missing)} missing: {', '.join(missing)}" if missing else "\neverything aotc needs is here")
