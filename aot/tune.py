"""``aotc build --tune``: benchmark a few tile configs per Matmul/Conv/Attention (and big Reduce) on the
build machine's GPU, keep the fastest, and remember it in the cache dir.

What it is: ``jobs`` (the tunable kernels of a program, identical kernels merged, each with its candidate
sources), ``compile_all`` (every candidate cubin, in parallel processes), ``Bench`` (the runtime's own
launcher on random device buffers sized at the example sizes, timed with CUDA events, in a child process
(``measure_isolated``: a candidate that faults on the device costs itself, not the build)), the winners'
cache (``<cache>/tune/``, keyed by kernel signature + shape bucket + SM + device + Triton version) and
``tune_program``, which the CUDA target build calls. Without a GPU of the target's SM it says so in one
line and the build uses the committed table / heuristic (``configs.choose``).
What it is not: the chooser (``codegen/triton/configs.py``) or a correctness check: a candidate is the
same kernel with other tile sizes, which the template tests cover.

Note (determinism): winners are read from the cache only under ``--tune``; a build without it never
looks, so the same input still gives a byte-identical package whatever the cache holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import sympy
from aotc import schema, shapes
from aotc.errors import AotcError, CompileError

from . import kernel as K
from .codegen import triton as tg
from .codegen.triton.configs import SM_COUNT, Config, Shape, candidates, choose
from .codegen.triton.sizes import example
from .cubin import Compiled, compile_many, sig_kind, triton_version
from .options import BuildOptions

TUNE_VERSION = 2  # 2: candidates timed as graph replays after a spin-up (1 read launch rates and cold clocks)
SPIN_UP_S = 0.5  # GPU work before the first timing, so the clock has ramped up
NAME = "tuned_kernel"  # every candidate gets this function name: identical kernels give identical sources
_SIG_CONFIG = Config(16, 16, 16, 4, 1)  # the config a kernel's signature is printed with (not a candidate)


@dataclass(frozen=True)
class Job:
    """One tunable kernel (or several identical ones): what to try and what to launch it on."""

    key: str  # the winners' cache key
    shape: Shape
    names: tuple[str, ...]  # the program's kernels it stands for
    default: Config  # what ``configs.choose`` picks without tuning
    candidates: tuple[tuple[Config, tg.TritonKernel], ...]
    buffers: tuple[tuple[str, str, int], ...]  # (buffer, dtype name, bytes at the example sizes)
    env: tuple[tuple[str, int], ...]  # symbol -> its example value (or hint)


@dataclass(frozen=True)
class Result:
    config: Config
    ms: float
    timings: tuple[tuple[str, float], ...]  # (config text, ms) per candidate that ran, fastest first
    cached: bool = False


def jobs(prog: K.Program, sm: int, options: BuildOptions, index_i64: bool, sm_count: int, device: str = "") -> list[Job]:
    """The tunable kernels of ``prog`` for ``sm``, merged by signature (a pure function: no GPU)."""
    by_key: dict[str, Job] = {}
    env = tuple(sorted((s.name, example(prog, sympy.Symbol(s.name))) for s in prog.symbols))
    for k in prog.kernels:
        if not tg.tunable(prog, k):
            continue
        s = tg.SHAPES[type(k)](prog, k, options)
        kn = replace(k, name=NAME)
        sig = tg.generate(prog, kn, options, sm, index_i64, _SIG_CONFIG).source
        doc = {"v": TUNE_VERSION, "sig": sig, "shape": s.key, "sm": sm, "sms": sm_count, "device": device,
               "triton": triton_version()}  # fmt: skip
        key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        if key in by_key:
            j = by_key[key]
            by_key[key] = replace(j, names=(*j.names, k.name))
            continue
        cands = tuple((c, tg.generate(prog, kn, options, sm, index_i64, c)) for c in candidates(s, sm))
        used = sorted({str(p.source[1]) for _, tk in cands for p in tk.params if p.source[0] == "buffer"})
        bufs = tuple((b, prog.buffer(b).dtype.value, example(prog, prog.buffer(b).nbytes())) for b in used)
        by_key[key] = Job(key, s, (k.name,), choose(s, sm)[0], cands, bufs, env)
    return [by_key[k] for k in sorted(by_key)]


# ---- compiling every candidate -----------------------------------------------------------------------


def compile_all(
    js: Sequence[Job], sm: int, cache_dir: str | os.PathLike[str], fp_fusion: bool, workers: int | None = None
) -> dict[tuple[str, Config], Compiled | str]:
    """Every candidate's cubin (or why it did not compile), through the cubin cache, in parallel processes."""
    work = [(j.key, c, tk) for j in js for c, tk in j.candidates]
    got = compile_many([tk for _, _, tk in work], sm, cache_dir, fp_fusion, workers)
    return {(key, c): r for (key, c, _), r in zip(work, got, strict=True)}


# ---- timing on the device ----------------------------------------------------------------------------


class Bench:
    """Launches candidates on one device with the runtime's launcher; device buffers are allocated once per
    (buffer name, type, size), filled with small random values (zeros for integer buffers: they index other
    buffers).

    Note: keyed by size, not by name alone. benchmarks/tune_table.py times the jobs of many programs in one
    Bench, and programs reuse names (``x``, ``buf67``) at other sizes: a job handed an earlier program's smaller
    buffer of the same name reads and writes past its end (ResNet-50's 1x1 conv writing 12.8 MB into ViT's
    2.4 MB ``buf67`` was CUDA_ERROR_ILLEGAL_ADDRESS on the H200; smaller overruns corrupted other buffers silently)."""

    def __init__(self, drv: Any, dev: Any, warmup: int = 3, budget_ms: float = 4.0, rounds: int = 3) -> None:
        drv.context(dev)
        self.drv, self.dev, self.warmup, self.budget_ms, self.rounds = drv, dev, warmup, budget_ms, rounds
        self.ptrs: dict[tuple[str, str, int], int] = {}
        self.warm = False
        p = drv.ffi.new("CUstream *")
        drv.check(drv.lib.cuStreamCreate(p, 1), "cuStreamCreate")
        self.stream = p[0]
        self.rng = np.random.default_rng(0)

    def buffer(self, name: str, dtype: str, nbytes: int) -> int:
        key = (name, dtype, nbytes)
        if key not in self.ptrs:
            ptr = self.drv.alloc(nbytes, f"tuning buffer {name}")
            self.ptrs[key] = ptr
            np_dt = schema.numpy_dtype(dtype)
            n = nbytes // np_dt.itemsize
            block = self.rng.uniform(-1, 1, min(n, 1 << 18)) if np_dt.kind == "f" else np.zeros(min(n, 1 << 18))
            host = np.resize(block.astype(np_dt), n)
            if host.nbytes:
                self.drv.upload(ptr, host, f"tuning buffer {name}")
        return self.ptrs[key]

    def time(self, job: Job, tk: tg.TritonKernel, c: Compiled) -> float:
        """Milliseconds per launch of ``tk`` (compiled as ``c``): the best of a few rounds of repeated launches."""
        from aotc.cuda_driver import FUNC_ATTR_MAX_DYNAMIC_SMEM
        from aotc.cuda_launch import launch_all, pack, repack

        drv, lib, ffi = self.drv, self.drv.lib, self.drv.ffi
        if c.shared > self.dev.smem_optin:
            raise CompileError(f"needs {c.shared} bytes of shared memory; the device has {self.dev.smem_optin}")
        mod = ffi.new("CUmodule *")
        image = ffi.from_buffer(c.cubin)
        drv.check(lib.cuModuleLoadData(mod, image), "cuModuleLoadData", c.name)
        try:
            fn = ffi.new("CUfunction *")
            drv.check(lib.cuModuleGetFunction(fn, mod[0], c.name.encode()), "cuModuleGetFunction", c.name)
            if c.shared > 48 * 1024:
                drv.check(lib.cuFuncSetAttribute(fn[0], FUNC_ATTR_MAX_DYNAMIC_SMEM, c.shared), "cuFuncSetAttribute", c.name)
            env = dict(job.env)
            kinds = [sig_kind(p.sig) for p in tk.params]
            k = c.kernel("tune", None, kinds)
            refs: dict[str, schema.Ref] = {}
            args = []
            for p, kind in zip(tk.params, kinds, strict=True):
                if p.source[0] == "buffer":
                    refs.setdefault(str(p.source[1]), schema.Ref("arena", len(refs)))
                    args.append(schema.Arg("ptr", buffer=refs[str(p.source[1])]))
                else:
                    args.append(schema.Arg(kind, expr=p.source[1]))
            grid = tuple(shapes.evaluate(g, env) for g in tk.grid)
            launch = schema.Launch(k.name, tk.grid, tuple(args))
            number: dict[Any, int] = {r: i for i, r in enumerate(refs.values())}
            number.update({"global_scratch": len(refs), "profile_scratch": len(refs) + 1})
            call = pack(drv, fn[0], k, launch, (grid[0] * k.num_ctas, grid[1], grid[2]), env, number)
            sizes = {b: (dt, n) for b, dt, n in job.buffers}
            if missing := [b for b in refs if b not in sizes]:  # a null pointer would fault on the device
                raise CompileError(f"buffers {', '.join(missing)} have no size to tune with")
            ptrs = [self.buffer(b, *sizes[b]) for b in refs]
            total = grid[0] * grid[1] * grid[2] * k.num_ctas
            scratch = self.drv.alloc(total * c.global_scratch_size + 256, "scratch") if c.global_scratch_size else 0
            try:
                repack([call], [*ptrs, scratch and -(-scratch // 256) * 256, 0], list(refs) + list(schema.SCRATCH),
                       {len(refs), len(refs) + 1})  # fmt: skip
                return self._measure(lambda n: launch_all(drv, [call] * n, self.stream, False))
            finally:
                self.drv.free(scratch)
        finally:
            lib.cuModuleUnload(mod[0])

    def _measure(self, run: Callable[[int], None]) -> float:
        """ms per launch of ``run(n)``'s launches, replayed as one CUDA graph so that Python's launch rate
        (a few us a launch) does not hide kernels shorter than that. The first measurement of a Bench first
        keeps the GPU busy for ``SPIN_UP_S``: an idle H200 sits at a few hundred MHz, and kernels timed while
        its clock ramps up read several times slower than they are."""
        from aotc.cuda_graph import Graphs

        drv, lib, ffi = self.drv, self.drv.lib, self.drv.ffi
        ev = [ffi.new("CUevent *") for _ in range(2)]
        for e in ev:
            drv.check(lib.cuEventCreate(e, 0), "cuEventCreate")
        ms = ffi.new("float *")
        graphs = Graphs(drv, self.stream, limit=2)

        def timed(go: Callable[[], None]) -> float:
            drv.check(lib.cuEventRecord(ev[0][0], self.stream), "cuEventRecord")
            go()
            drv.check(lib.cuEventRecord(ev[1][0], self.stream), "cuEventRecord")
            drv.check(lib.cuEventSynchronize(ev[1][0]), "cuEventSynchronize")
            drv.check(lib.cuEventElapsedTime(ms, ev[0][0], ev[1][0]), "cuEventElapsedTime")
            return float(ms[0])

        try:
            timed(lambda: run(self.warmup))
            if not self.warm:
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < SPIN_UP_S:
                    timed(lambda: run(20))
                self.warm = True
            one = max(timed(lambda: run(3)) / 3, 1e-4)
            n = int(min(500, max(10, self.budget_ms / one)))

            def replay() -> None:
                if not graphs.run(n, lambda: run(n), lambda: "a tuning candidate"):
                    run(n)  # capture failed: plain launches (the launch rate then bounds short kernels)

            replay()
            return min(timed(replay) / n for _ in range(self.rounds))
        finally:
            graphs.clear()
            for e in ev:
                lib.cuEventDestroy_v2(e[0])

    def close(self) -> None:
        for p in self.ptrs.values():
            self.drv.free(p)
        self.ptrs.clear()
        self.drv.lib.cuStreamDestroy_v2(self.stream)


def bench_job(
    bench: Bench,
    job: Job,
    compiled: dict[tuple[str, Config], Compiled | str],
    skip: frozenset[str] = frozenset(),
    report: Callable[[dict[str, Any]], None] | None = None,
) -> Result | None:
    """Time every candidate of ``job`` that compiled (but those in ``skip``, by config text); None when none
    ran. ``report`` hears of each candidate before it runs and with its time after."""
    from aotc.errors import DeviceError

    timings: list[tuple[float, Config]] = []
    for c, tk in job.candidates:
        cc = compiled.get((job.key, c))
        if not isinstance(cc, Compiled) or str(c) in skip:
            continue
        if report:
            report({"start": str(c)})
        try:
            timings.append((bench.time(job, tk, cc), c))
            if report:
                report({"done": str(c), "ms": timings[-1][0]})
        except (CompileError, DeviceError):
            if bench.drv.broken is not None:
                raise
    if not timings:
        return None
    timings.sort(key=lambda t: (t[0], t[1]))
    return Result(timings[0][1], timings[0][0], tuple((str(c), round(t, 5)) for t, c in timings))


# ---- timing in a child process -----------------------------------------------------------------------

MAX_CRASHES = 8  # candidates that may take a child down before the rest of the tuning is given up


def measure_isolated(
    todo: Sequence[Job],
    compiled: dict[tuple[str, Config], Compiled | str],
    sm: int,
    note: Callable[[str], None],
    spawn: Callable[[Path], subprocess.Popen[str]] | None = None,
) -> dict[str, Result | None]:
    """Time ``todo`` in a child process (``python -m aotc_build.tune_worker``), so that a candidate that
    faults on the device (an illegal address leaves the CUDA context unusable) costs that candidate, not the
    build: the child reports each candidate before it runs, and when it dies the one it was running is
    skipped and a new child carries on with the rest."""
    spawn = spawn or _spawn_worker
    skip: dict[str, set[str]] = {}
    results: dict[str, Result | None] = {}
    times: dict[str, list[tuple[float, str]]] = {}
    crashes = 0
    with tempfile.TemporaryDirectory(prefix="aotc-tune-") as tmp:
        while True:
            left = [j for j in todo if j.key not in results]
            if not left:
                return results
            work = Path(tmp) / "work.pkl"
            with open(work, "wb") as f:
                pickle.dump({"sm": sm, "jobs": left, "skip": {k: sorted(v) for k, v in skip.items()},
                             "compiled": {kc: compiled[kc] for kc in compiled if kc[0] in {j.key for j in left}}}, f)  # fmt: skip
            child = spawn(work)
            running: tuple[str, str] | None = None
            assert child.stdout is not None
            for line in child.stdout:
                msg = json.loads(line)
                key = msg.get("job", "")
                if "start" in msg:
                    running = (key, msg["start"])
                elif "done" in msg:
                    times.setdefault(key, []).append((float(msg["ms"]), msg["done"]))
                    running = None
                elif "result" in msg:
                    results[key] = _result(msg["result"])
            rc = child.wait()
            err = work.with_suffix(".err").read_text(errors="replace") if work.with_suffix(".err").exists() else ""
            if rc == 0:
                for j in left:  # a job the child finished without a result line had no candidate run
                    results.setdefault(j.key, None)
                continue
            crashes += 1
            if running is None or crashes > MAX_CRASHES:
                note(f"aotc build --tune: the timing process failed ({err.strip().splitlines()[-1:] or ['no message']}); "
                     "kernels left untimed use the table/heuristic configs")  # fmt: skip
                for j in left:
                    results.setdefault(j.key, _best(times.get(j.key, []), j))
                return results
            key, cfg = running
            skip.setdefault(key, set()).add(cfg)
            why = next((ln for ln in reversed(err.splitlines()) if ln.strip()), "no message")
            shape = next((j.shape.key for j in todo if j.key == key), key)
            note(f"aotc build --tune: candidate {cfg} of {shape} ({key[:12]}) crashed the timing process "
                 f"({why.strip()[:160]}); skipped")  # fmt: skip


def _spawn_worker(work: Path) -> subprocess.Popen[str]:
    """The child for ``work``: JSON lines on its stdout, its stderr in WORK.err (read after it exits)."""
    with open(work.with_suffix(".err"), "w") as err:
        return subprocess.Popen([sys.executable, "-m", f"{__package__}.tune_worker", str(work)],
                                stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip


def _result(doc: dict[str, Any]) -> Result:
    return Result(Config.from_json(doc["config"]), float(doc["ms"]), tuple((a, float(b)) for a, b in doc["timings"]))


def _best(timed: list[tuple[float, str]], job: Job) -> Result | None:
    """The fastest candidate a crashed child timed before it died (None: none)."""
    by_text = {str(c): c for c, _ in job.candidates}
    timed = sorted(t for t in timed if t[1] in by_text)
    if not timed:
        return None
    return Result(by_text[timed[0][1]], timed[0][0], tuple((c, round(ms, 5)) for ms, c in timed))


def run_worker(work: Path, out: Callable[[dict[str, Any]], None], drv: Any = None) -> None:
    """The child's side of ``measure_isolated``: time the jobs in ``work`` and ``out`` one message per event."""
    with open(work, "rb") as f:
        doc = pickle.load(f)  # written by our own parent process, in a private temporary folder
    found = find_device(doc["sm"], drv)
    if isinstance(found, str):
        raise SystemExit(found)
    bench = Bench(*found)
    try:
        for j in doc["jobs"]:

            def report(msg: dict[str, Any], key: str = j.key) -> None:
                out({"job": key, **msg})

            r = bench_job(bench, j, doc["compiled"], frozenset(doc["skip"].get(j.key, ())), report)
            if r is not None:
                out({"job": j.key, "result": {"config": r.config.to_json(), "ms": r.ms, "timings": r.timings}})
    finally:
        bench.close()


# ---- the winners' cache ------------------------------------------------------------------------------


def _entry(cache_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(cache_dir) / "tune" / key[:2] / f"{key}.json"


def cached(cache_dir: str | os.PathLike[str], key: str) -> Result | None:
    try:
        doc = json.loads(_entry(cache_dir, key).read_text())
        return Result(Config.from_json(doc["config"]), float(doc["ms"]), tuple((a, float(b)) for a, b in doc["timings"]), True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(cache_dir: str | os.PathLike[str], job: Job, r: Result, device: str) -> None:
    path = _entry(cache_dir, job.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"shape": job.shape.key, "device": device, "config": r.config.to_json(), "ms": r.ms, "timings": r.timings}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, sort_keys=True)
    os.replace(tmp, path)


# ---- the build's entry point -------------------------------------------------------------------------


def find_device(sm: int, drv: Any = None) -> tuple[Any, Any] | str:
    """(driver, device) of the first GPU of exactly ``sm``, or why there is none."""
    try:
        if drv is None:
            from aotc.cuda_driver import driver

            drv = driver()
        for i in range(drv.device_count()):
            dev = drv.device(i)
            if dev.sm == sm:
                return drv, dev
        return f"no sm_{sm} GPU among the {drv.device_count()} visible"
    except AotcError as e:  # no driver, no device: the reason's first clause
        return f"no usable GPU ({re.split(r' [(]|[:;]', str(e), maxsplit=1)[0]})"


def tune_program(
    prog: K.Program,
    sm: int,
    options: BuildOptions,
    cache_dir: str | os.PathLike[str],
    index_i64: bool,
    drv: Any = None,
    note: Callable[[str], None] | None = None,
) -> dict[str, Config]:
    """The tuned config of every tunable kernel of ``prog`` that has one (cached or measured now); kernels
    left out get ``configs.choose``'s pick. ``drv``: a driver binding (tests pass a stand-in, which is then
    timed in this process; the real driver times candidates in a child process, ``measure_isolated``)."""
    isolated = drv is None
    note = note or (lambda line: print(line, file=sys.stderr))
    found = find_device(sm, drv)
    if isinstance(found, str):
        note(f"aotc build --tune: {found}; using the sm_{sm} table/heuristic tile configs")
        return {}
    drv, dev = found
    js = jobs(prog, sm, options, index_i64, dev.sm_count or SM_COUNT.get(sm, 0), dev.name)
    out: dict[str, Config] = {}
    todo = []
    for j in js:
        r = cached(cache_dir, j.key)
        if r is None:
            todo.append(j)
        else:
            out.update(dict.fromkeys(j.names, r.config))
    if todo:
        compiled = compile_all(todo, sm, cache_dir, options.cuda_fp_fusion)
        if isolated:
            results = measure_isolated(todo, compiled, sm, note)
        else:
            bench = Bench(drv, dev)
            try:
                results = {j.key: bench_job(bench, j, compiled) for j in todo}
            finally:
                bench.close()
        for j in todo:
            r = results.get(j.key)
            if r is not None:
                store(cache_dir, j, r, dev.name)
                out.update(dict.fromkeys(j.names, r.config))
    note(f"aotc build --tune: {len(js)} kernel shapes on {dev.name} (sm_{sm}), {len(js) - len(todo)} from the cache")
    return out
