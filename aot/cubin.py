"""Triton source → cubins for one SM target, cross-compiled without a GPU; the manifest's CUDA target.

What it is: the driver around ``triton.compile(ASTSource(...), target=GPUTarget("cuda", sm, 32))``. Each
kernel's source is written to a file and imported (Triton reads a real function), compiled, and checked: the
parameter list comes from the PTX ``.entry`` signature (the scratch pointers Triton appends are counted there,
not taken from a version table), and the cubin must be an ELF for the requested SM. Results are cached on
disk, content-addressed by source + target + options + Triton/ptxas versions, so rebuilds skip Triton.
What it is not: a launcher. ``aotc.cuda`` runs what this records.

Note: line info is turned off. With it, ptxas embeds the absolute path of the generated source file in the
cubin, and the same model built in two directories would give two different packages (rule 6).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import keyword
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import sympy
from aotc import schema
from aotc.errors import CompileError

from . import kernel as K
from .codegen import triton as tg
from .codegen.triton.splitk import split_k
from .memory import plan_memory
from .options import BuildOptions, Target
from .symbolic import to_size

CACHE_VERSION = 1
EM_CUDA = 190
_SIG_KIND = {"fp32": "f32", "fp64": "f64", "fp16": "f16", "bf16": "bf16", "i1": "i1", "i8": "i8", "u8": "u8",
             "i16": "i16", "i32": "i32", "i64": "i64"}  # fmt: skip
_PTX_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
_ENTRY = re.compile(r"\.(?:visible\s+)?\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\b[^,\n]*?(\w+)(?:\[(\d+)\])?\s*(?:,|$)", re.M)


@dataclass(frozen=True)
class Compiled:
    """One compiled kernel: the cubin and everything a launcher needs to know about it."""

    name: str
    sm: int
    cubin: bytes
    ptx_params: tuple[int, ...]  # byte width of each .entry parameter
    num_args: int  # launch arguments (the non-constexpr signature entries); the rest are scratch pointers
    num_warps: int
    num_ctas: int
    cluster_dims: tuple[int, int, int]
    shared: int
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    launch_cooperative_grid: bool
    launch_pdl: bool
    enable_fp_fusion: bool
    triton_version: str
    ptxas_version: str
    ptx: str = ""  # the PTX ptxas assembled the cubin from: packages carry it for the driver's JIT (aotc.cuda_ptx)

    def kernel(self, member: str, source: str | None, kinds: list[str], ptx: str | None = None) -> schema.Kernel:
        """The manifest's entry for this cubin, stored at ``member`` with its Triton source at ``source`` and
        its PTX at ``ptx``; ``kinds`` are the launch arguments' parameter kinds (the scratch pointers Triton
        appends follow)."""
        all_kinds = [*kinds, *schema.SCRATCH[: len(self.ptx_params) - self.num_args]]
        params = tuple(schema.Param(k, b) for k, b in zip(all_kinds, self.ptx_params, strict=True))
        return schema.Kernel(member=member, source=source, ptx=ptx, params=params, **{f: getattr(self, f) for f in _KERNEL_FIELDS})


# The launch facts a compiled kernel shares, by name, with its manifest entry: taken from the dataclasses,
# so a field added to both flows through without another copy line here.
_KERNEL_FIELDS = tuple(sorted(({f.name for f in fields(Compiled)} & {f.name for f in fields(schema.Kernel)}) - {"ptx"}))


# ---- facts read from the toolchain and its outputs ---------------------------------------------------


def triton_version() -> str:
    import triton

    return str(triton.__version__)


def ptxas_version(sm: int) -> str:
    """``major.minor`` of the ptxas Triton uses for ``sm`` (Triton 3.9 uses a newer one from sm_90 on)."""
    tool = None
    with contextlib.suppress(ImportError, AttributeError):
        from triton.backends.nvidia import compiler as nv

        tool = nv.get_ptxas(sm) if hasattr(nv, "get_ptxas") else None
    if tool is None:
        from triton import knobs

        tool = knobs.nvidia.ptxas
    m = re.search(r"(\d+)\.(\d+)", str(tool.version))
    if not m:
        raise CompileError(f"cannot read the ptxas version from {tool.path!r} (got {tool.version!r})")
    return f"{m.group(1)}.{m.group(2)}"


def ptx_params(ptx: str, name: str) -> tuple[int, ...]:
    """Byte widths of the parameters of ``.entry name`` in PTX text."""
    for m in _ENTRY.finditer(ptx):
        if m.group(1) == name:
            out = []
            for p in _PARAM.finditer(m.group(2)):
                width = _PTX_BYTES.get(p.group(2))
                if width is None:
                    raise CompileError(f"PTX parameter {p.group(0).strip()!r} of {name}: unknown width")
                out.append(width * int(p.group(4) or 1))
            declared = m.group(2).count(".param")
            if declared != len(out):
                raise CompileError(f"PTX .entry {name}: read {len(out)} of {declared} parameters")
            return tuple(out)
    raise CompileError(f"no .entry {name} in the PTX Triton produced")


def check_cubin(cubin: bytes, sm: int, ptxas: str, where: str) -> None:
    """The cubin is a 64-bit CUDA ELF whose e_flags name ``sm`` (bits 0-7 for ptxas 12.x, 8-15 from 13.x)."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise CompileError(f"{where}: the cubin is not a 64-bit ELF")
    machine = struct.unpack_from("<H", cubin, 0x12)[0]
    if machine != EM_CUDA:
        raise CompileError(f"{where}: the cubin's ELF machine is {machine}, not EM_CUDA ({EM_CUDA})")
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    major = int(ptxas.split(".", maxsplit=1)[0])
    got = (flags >> 8) & 0xFF if major >= 13 else flags & 0xFF
    if got != sm:
        raise CompileError(f"{where}: the cubin is for sm_{got} (e_flags {flags:#x}, ptxas {ptxas}), not sm_{sm}")


def elf_sm(cubin: bytes, ptxas: str) -> int:
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if int(ptxas.split(".", maxsplit=1)[0]) >= 13 else flags & 0xFF


# ---- compiling one kernel ----------------------------------------------------------------------------


@contextlib.contextmanager
def _triton_settings(tmp: str) -> Iterator[None]:
    """Triton's own cache in a throwaway folder; no line info (see the module note)."""
    from triton import knobs

    with knobs.cache.scope(), knobs.compilation.scope():
        knobs.cache.dir = tmp
        knobs.compilation.disable_line_info = True
        yield


def compile_source(
    source: str,
    fn_name: str,
    signature: Mapping[str, str],
    constexprs: Mapping[str, int | float | bool],
    *,
    sm: int,
    cache_dir: str | os.PathLike[str],
    num_warps: int = 4,
    num_stages: int = 3,
    enable_fp_fusion: bool = True,
    aligned: tuple[str, ...] = (),
    extra_options: Mapping[str, Any] | None = None,
) -> Compiled:
    """Compile ``fn_name`` of the module text ``source`` for ``sm`` (an int), through the on-disk cache.

    ``aligned`` names pointer arguments promised to be 16-byte aligned (the runtime keeps that promise);
    ``extra_options`` go to Triton as they are (``num_ctas``, ``launch_pdl``, ...)."""
    extra = dict(sorted((extra_options or {}).items()))
    cache = Path(cache_dir)
    tv, pv = triton_version(), ptxas_version(sm)
    key = _cache_key(source, fn_name, signature, constexprs, sm, num_warps, num_stages, enable_fp_fusion, aligned, extra)
    entry = cache / "cubin" / key[:2] / key
    hit = _read_cache(entry)
    if hit is not None:
        return hit
    src_path = cache / "src" / key[:2] / key / f"{fn_name}.py"
    src_path.parent.mkdir(parents=True, exist_ok=True)
    src_path.write_text(source)
    where = f"{src_path} (kernel {fn_name}, sm_{sm})"
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource

        spec = importlib.util.spec_from_file_location(f"aotc_kernel_{key[:16]}", src_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, fn_name)
        names = list(signature)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        src = ASTSource(fn, dict(signature), constexprs=dict(constexprs), attrs=attrs)
        opts = {
            "num_warps": num_warps,
            "num_stages": num_stages,
            "enable_fp_fusion": enable_fp_fusion,
            **extra,
        }
        with tempfile.TemporaryDirectory(prefix="aotc-triton-") as tmp, _triton_settings(tmp):
            ck = triton.compile(src, target=GPUTarget("cuda", sm, 32), options=opts)
            cubin, ptx, md = bytes(ck.asm["cubin"]), str(ck.asm["ptx"]), ck.metadata
    except CompileError:
        raise
    except Exception as e:  # Triton raises many types; each becomes one CompileError naming the file
        msg = str(e).strip() or type(e).__name__
        raise CompileError(f"triton.compile failed for {where}: {type(e).__name__}: {msg}") from e
    check_cubin(cubin, sm, pv, where)
    params = ptx_params(ptx, md.name)
    num_args = sum(1 for v in signature.values() if v != "constexpr")
    if not num_args <= len(params) <= num_args + 2:
        raise CompileError(f"{where}: PTX has {len(params)} parameters for {num_args} launch arguments")
    cd = tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1))
    out = Compiled(
        name=md.name,
        sm=sm,
        cubin=cubin,
        ptx_params=params,
        num_args=num_args,
        num_warps=int(md.num_warps),
        num_ctas=int(getattr(md, "num_ctas", 1)),
        cluster_dims=(int(cd[0]), int(cd[1]), int(cd[2])),
        shared=int(md.shared),
        global_scratch_size=int(getattr(md, "global_scratch_size", 0) or 0),
        global_scratch_align=int(getattr(md, "global_scratch_align", 1) or 1),
        profile_scratch_size=int(getattr(md, "profile_scratch_size", 0) or 0),
        profile_scratch_align=int(getattr(md, "profile_scratch_align", 1) or 1),
        launch_cooperative_grid=bool(getattr(md, "launch_cooperative_grid", False)),
        launch_pdl=bool(getattr(md, "launch_pdl", False)),
        enable_fp_fusion=bool(md.enable_fp_fusion),
        triton_version=tv,
        ptxas_version=pv,
        ptx=ptx,
    )
    for i, (kind, width) in enumerate(zip(signature.values(), params, strict=False)):
        if kind == "constexpr":
            continue
        want = 8 if kind.startswith("*") else schema.SCALAR_BYTES[_SIG_KIND[kind]]
        if width != want:
            raise CompileError(f"{where}: PTX parameter {i} is {width} bytes; a {kind} argument needs {want}")
    _write_cache(entry, out)
    return out


def _cache_key(
    source: str, fn_name: str, signature: Mapping[str, str], constexprs: Mapping[str, int | float | bool], sm: int,
    num_warps: int, num_stages: int, enable_fp_fusion: bool, aligned: tuple[str, ...], extra: Mapping[str, Any],
) -> str:  # fmt: skip
    key_doc = {
        "v": CACHE_VERSION, "source": source, "fn": fn_name, "signature": dict(signature),
        "constexprs": {k: constexprs[k] for k in sorted(constexprs)}, "sm": sm, "num_warps": num_warps,
        "num_stages": num_stages, "fp_fusion": enable_fp_fusion, "aligned": list(aligned),
        "extra": dict(extra),
        "triton": triton_version(), "ptxas": ptxas_version(sm),
    }  # fmt: skip
    return hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()


def _read_cache(entry: Path) -> Compiled | None:
    try:
        meta = json.loads(entry.with_suffix(".json").read_text())
        cubin = entry.with_suffix(".cubin").read_bytes()
        ptx = entry.with_suffix(".ptx").read_text()  # an entry written before packages carried PTX has none
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.pop("cubin_sha256", None):
        return None
    if hashlib.sha256(ptx.encode()).hexdigest() != meta.pop("ptx_sha256", None):
        return None
    meta["ptx"] = ptx
    meta["ptx_params"] = tuple(meta["ptx_params"])
    meta["cluster_dims"] = tuple(meta["cluster_dims"])
    return Compiled(cubin=cubin, **meta)


def _write_cache(entry: Path, c: Compiled) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in asdict(c).items() if k not in ("cubin", "ptx")}
    meta["cubin_sha256"] = hashlib.sha256(c.cubin).hexdigest()
    meta["ptx_sha256"] = hashlib.sha256(c.ptx.encode()).hexdigest()
    # the .json last: it is what marks the entry complete
    for suffix, data in ((".cubin", c.cubin), (".ptx", c.ptx.encode()), (".json", json.dumps(meta, sort_keys=True).encode())):
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=entry.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, entry.with_suffix(suffix))


def compile_kernel(tk: tg.TritonKernel, sm: int, cache_dir: str | os.PathLike[str], enable_fp_fusion: bool = True) -> Compiled:
    src, fn, sig, consts, warps, stages, aligned = _kernel_args(tk)
    return compile_source(
        src, fn, sig, consts, sm=sm, cache_dir=cache_dir, num_warps=warps, num_stages=stages,
        enable_fp_fusion=enable_fp_fusion, aligned=aligned,
    )  # fmt: skip


def _kernel_args(tk: tg.TritonKernel) -> tuple[str, str, dict[str, str], dict[str, int | float | bool], int, int, tuple[str, ...]]:
    aligned = tuple(p.name for p in tk.params if p.sig.startswith("*"))
    return tk.source, tk.name, tk.signature(), dict(tk.constexprs), tk.num_warps, tk.num_stages, aligned


def cached_kernel(tk: tg.TritonKernel, sm: int, cache_dir: str | os.PathLike[str], enable_fp_fusion: bool = True) -> Compiled | None:
    """``compile_kernel``'s result when the cubin cache has it, else None (Triton is not run)."""
    src, fn, sig, consts, warps, stages, aligned = _kernel_args(tk)
    key = _cache_key(src, fn, sig, consts, sm, warps, stages, enable_fp_fusion, aligned, {})
    return _read_cache(Path(cache_dir) / "cubin" / key[:2] / key)


def compile_many(
    tks: list[tg.TritonKernel], sm: int, cache_dir: str | os.PathLike[str], enable_fp_fusion: bool = True, workers: int | None = None,
    on_done: Callable[[int, int], None] | None = None,
) -> list[Compiled | str]:  # fmt: skip
    """``compile_kernel`` for each kernel (a CompileError's message where one fails); cache misses compile in
    parallel processes (Triton holds the GIL while it compiles, so threads would not help). ``on_done(n, total)``
    hears each kernel finish (cache hits count as done at once)."""
    out: list[Compiled | str | None] = [cached_kernel(tk, sm, cache_dir, enable_fp_fusion) for tk in tks]
    misses = [i for i, c in enumerate(out) if c is None]
    tell = on_done or (lambda n, total: None)
    tell(len(tks) - len(misses), len(tks))
    workers = max(1, min(workers or os.cpu_count() or 1, len(misses)))
    if workers == 1:
        for n, i in enumerate(misses, 1):
            out[i] = _compile_or_message(tks[i], sm, str(cache_dir), enable_fp_fusion)
            tell(len(tks) - len(misses) + n, len(tks))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("forkserver")  # no fork of a process that may hold a CUDA context
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_die_with_build, initargs=(os.getpid(),)) as pool:
            futs = {i: pool.submit(_compile_or_message, tks[i], sm, str(cache_dir), enable_fp_fusion) for i in misses}
            for n, (i, f) in enumerate(futs.items(), 1):
                out[i] = f.result()
                tell(len(tks) - len(misses) + n, len(tks))
    return [c if c is not None else "not compiled" for c in out]


def _die_with_build(build_pid: int) -> None:
    """In each compile worker: exit when the build is gone. The workers are children of the forkserver, not
    of the build, and wait on a queue whose both ends they hold, so a build killed with SIGKILL would leave
    them (and the forkserver, which lives while they do) waiting forever."""
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(build_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except OSError:
                pass  # alive (or not ours to signal): keep going

    threading.Thread(target=watch, name="aotc-die-with-build", daemon=True).start()


def _compile_or_message(tk: tg.TritonKernel, sm: int, cache_dir: str, enable_fp_fusion: bool) -> Compiled | str:
    try:
        return compile_kernel(tk, sm, cache_dir, enable_fp_fusion)
    except CompileError as e:
        return str(e)


def sig_kind(sig: str) -> str:
    return "ptr" if sig.startswith("*") else _SIG_KIND[sig]


# ---- the whole program -------------------------------------------------------------------------------


def kernel_name(name: str, taken: set[str]) -> str:
    """A Python/PTX identifier for a kernel name, unique among ``taken``."""
    base = re.sub(r"\W", "_", name) or "kernel"
    if base[0].isdigit() or keyword.iskeyword(base) or base in {"tl", "triton", "libdevice"}:
        base = "k_" + base
    out, n = base, 1
    while out in taken:
        out, n = f"{base}_{n}", n + 1
    taken.add(out)
    return out


def arena_layout(prog: K.Plan) -> tuple[tuple[schema.Slot, ...], Any]:
    """Byte offsets of the arena buffers and the arena size: the memory plan's, or one buffer after another
    at 256-byte alignment where the program has no plan."""
    offsets: dict[str, Any] = dict(prog.arena_offsets)
    size: Any = prog.arena_size
    if any(b.name not in offsets for b in prog.arena):
        end: Any = 0
        for b in prog.arena:
            offsets[b.name] = end
            end = end + 256 * sympy.ceiling(sympy.sympify(b.nbytes()) / 256)
        size = end
    return tuple(schema.Slot(b.name, to_size(offsets[b.name])) for b in prog.arena), to_size(size)


# (program, sm, options, cache dir, index_i64) -> tuned config by kernel name; aot.tune.tune_program is one
Tuner = Callable[[K.Plan, int, BuildOptions, Any, bool], dict[str, Any]]


def build_cuda_target(
    prog: K.Plan, target: Target, options: BuildOptions, cache_dir: str | os.PathLike[str] | None,
    tuner: Tuner | None = None, on_done: Callable[[int, int], None] | None = None,
) -> tuple[schema.CudaTarget, dict[str, bytes]]:  # fmt: skip
    """Every kernel of ``prog`` as a cubin for ``target`` (``cuda:sm_NN``): the manifest's CUDA target and
    the package members it names (``cuda/sm_NN/<kernel>.cubin`` and the Triton source beside it). Pointer
    arguments name ``prog``'s inputs, outputs and weights by index: the manifest lists them in that order.

    ``cache_dir``: the content-addressed cubin cache (None: a throwaway folder, nothing reused). ``tuner``:
    picks tile configs by timing them (``aotc build --tune`` passes ``aot.tune.tune_program``; the tuner
    itself compiles through this module, so it is handed in rather than imported)."""
    if target.kind != "cuda":
        raise CompileError(f"build_cuda_target needs a cuda target, got {target}")
    if cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="aotc-cubins-") as tmp:
            return build_cuda_target(prog, target, options, tmp, tuner)
    sm = target.sm
    split = split_k(prog, sm, options)  # skinny long-K matmuls: K slices + a sum kernel (this target only)
    if split is not prog:
        prog = plan_memory(split)
    refs = {
        b.name: schema.Ref(group, i)
        for group, bufs in (("input", prog.inputs), ("output", prog.outputs), ("weight", prog.weights), ("arena", prog.arena))
        for i, b in enumerate(bufs)
    }  # fmt: skip
    taken: set[str] = set()
    by_body: dict[str, schema.Kernel] = {}
    kernels: list[schema.Kernel] = []
    launches: list[schema.Launch] = []
    members: dict[str, bytes] = {}
    versions: set[str] = set()
    index_i64 = tg.index_is_i64(prog)  # a property of the whole program; ~0.04 s a kernel to recompute
    tuned: dict[str, tg.Config] = tuner(prog, sm, options, cache_dir, index_i64) if tuner is not None else {}
    generated = []
    for k in prog.kernels:
        name = kernel_name(k.name, taken)
        tk = tg.generate(prog, _renamed(k, name), options, sm, index_i64, tuned.get(k.name))
        generated.append((name, tk, tk.source.replace(f"def {name}(", "def __kernel__(", 1)))
    firsts = {body: tk for _, tk, body in reversed(generated)}  # each body's first kernel compiles it
    done = dict(zip(firsts, compile_many(list(firsts.values()), sm, cache_dir, options.cuda_fp_fusion, on_done=on_done), strict=True))
    for name, tk, body in generated:
        kinds = [sig_kind(p.sig) for p in tk.params]
        pk = by_body.get(body)
        if pk is None:
            c = done[body]
            if isinstance(c, str):
                raise CompileError(c)
            versions.add(c.ptxas_version)
            member, source, ptx = (f"cuda/{target.arch}/{name}.{ext}" for ext in ("cubin", "py", "ptx"))
            members[member] = c.cubin
            members[source] = tk.source.encode()
            members[ptx] = c.ptx.encode()
            pk = by_body[body] = c.kernel(member, source, kinds, ptx)
            kernels.append(pk)
        args = []
        for p, kind in zip(tk.params, kinds, strict=True):
            if p.source[0] == "buffer":
                args.append(schema.Arg("ptr", buffer=refs[str(p.source[1])]))
            else:
                args.append(schema.Arg(kind, expr=p.source[1]))
        launches.append(schema.Launch(pk.name, tk.grid, tuple(args)))
    arena, arena_bytes = arena_layout(prog)
    ptxas = max(versions, key=lambda v: tuple(map(int, v.split(".")))) if versions else ptxas_version(sm)
    t = schema.CudaTarget(
        arch=target.arch,
        triton_version=triton_version(),
        ptxas_version=ptxas,
        min_driver=int(ptxas.split(".")[0]) * 1000,
        precision=options.precision,
        arena_bytes=arena_bytes,
        arena=arena,
        kernels=tuple(kernels),
        launches=tuple(launches),
    )
    return t, members


def _renamed(k: K.Kernel, name: str) -> K.Kernel:
    from dataclasses import replace

    return k if k.name == name else replace(k, name=name)
