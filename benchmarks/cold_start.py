"""Cold start of a CPU package: new process -> import numpy, aotc -> load -> first output, idle and with one busy core.

    python benchmarks/cold_start.py PKG [--runs 11] [--aotc-first] [--stages] [--baseline PYTHON:PKG]
                                        [--env KEY=VAL ...] [--floor] [--out FILE.json]

Each run is a fresh interpreter that times itself from before ``import numpy`` to the first output (the
figure benchmarks/cpu_side_by_side.py reports as ``import_to_output_s``) and each phase on the way: numpy,
aotc's import, ``aotc.load`` (hashes, dlopen) and the first call; wall and CPU seconds (all threads).
``process`` is the parent's wall time from starting the interpreter to its exit (adds Python's own start).
``--aotc-first`` adds a side that imports aotc and calls ``aotc.load`` before it imports numpy (then the
load's hashing runs beside numpy's import: the order to write for the shortest start).
``--baseline PYTHON:PKG`` also times another runtime (e.g. an older checkout's venv python with a package
it built), interleaved run by run with this one, so both see the same load (in both orders with
--aotc-first); ``--baseline-env KEY=VAL`` sets variables for it alone (with this repository's development
shim, AOTC_WORKTREE=DIR picks the runtime: ``git archive BASE | tar -x -C DIR``, then
``--baseline "$(which python):PKG" --baseline-env AOTC_WORKTREE=DIR``). ``--stages`` splits this
runtime's load into its steps (map and start hashing, imports, manifest, hashes checked, dlopen).
``--floor`` adds the CPU seconds of the parts no order or thread count removes, each timed alone (numpy's
import, sha256 of the package, mapping its pages, the first call's flops) and their sum over the cores the
busy runs got: the shortest busy cold start this machine allows. ``--env KEY=VAL`` adds a side:
this runtime with those variables set (e.g. OPENBLAS_NUM_THREADS=1: numpy's OpenBLAS then starts no
worker thread at import, a thread that spins for ~0.1 s and costs the import 30-80 ms on 2 cores; aotc
never calls numpy's BLAS). The busy process is
``while True: pass``, unpinned, as in cpu_side_by_side.py. Prints (and with --out writes) JSON with the
medians and the load average; build the MLP package with
``python benchmarks/cpu_contention.py --build-only --models mlp --pkg-dir DIR``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_timing import busy_core

CHILD = """
import sys, time
marks = [(time.perf_counter(), time.process_time())]
import numpy as np
marks.append((time.perf_counter(), time.process_time()))
import aotc
marks.append((time.perf_counter(), time.process_time()))
m = aotc.load(sys.argv[1], device="cpu")
marks.append((time.perf_counter(), time.process_time()))
x = np.zeros([d if isinstance(d, int) else 1 for d in m.inputs[0].shape], np.dtype(m.inputs[0].dtype))
y = m(x)
marks.append((time.perf_counter(), time.process_time()))
names = ("numpy", "import_aotc", "load", "first_call")
out = {n: [b[0] - a[0], b[1] - a[1]] for n, a, b in zip(names, marks, marks[1:])}
out["import_to_output"] = [marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]]
print(repr(out))
"""

# --aotc-first: what a script written for a short start does; aotc.load starts hashing before numpy is imported.
AOTC_FIRST = """
import sys, time
marks = [(time.perf_counter(), time.process_time())]
import aotc
marks.append((time.perf_counter(), time.process_time()))
m = aotc.load(sys.argv[1], device="cpu")
marks.append((time.perf_counter(), time.process_time()))
import numpy as np
marks.append((time.perf_counter(), time.process_time()))
x = np.zeros([d if isinstance(d, int) else 1 for d in m.inputs[0].shape], np.dtype(m.inputs[0].dtype))
y = m(x)
marks.append((time.perf_counter(), time.process_time()))
names = ("import_aotc", "load_incl_numpy", "numpy_after_load", "first_call")
out = {n: [b[0] - a[0], b[1] - a[1]] for n, a, b in zip(names, marks, marks[1:])}
out["import_to_output"] = [marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]]
print(repr(out))
"""

# --stages: aotc.load's steps one by one (this runtime's aotc.loading.load, spelled out), each timed.
_MARKS = """
import sys, time
marks = [(time.perf_counter(), time.process_time())]
names = []
def mark(name):
    marks.append((time.perf_counter(), time.process_time()))
    names.append(name)
"""
# From the hashes checked to the second call: the same in both orders.
_CHECK_TO_CALLS = """from aotc.loading import verify_for_load
from aotc.model import Model
from aotc.package import Package
mark("import_schema_package_model")
pkg = Package(sys.argv[1], None, c)
mark("manifest")
from aotc.cpu import CpuExecutor, select_target
mark("import_cpu")
verify_for_load(pkg)
sys.setswitchinterval(0.005)
mark("hashes_checked")
m = Model(pkg, CpuExecutor(pkg, select_target(pkg.manifest.cpu_targets)))
mark("weights_and_dlopen")
x = np.zeros([d if isinstance(d, int) else 1 for d in m.inputs[0].shape], np.dtype(m.inputs[0].dtype))
y = m(x)
mark("first_call")
out = {n: [b[0] - a[0], b[1] - a[1]] for n, a, b in zip(names, marks, marks[1:])}
out["import_to_output"] = [marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]]
t = (time.perf_counter(), time.process_time())
y = m(x)
out["second_call"] = [time.perf_counter() - t[0], time.process_time() - t[1]]  # not part of import_to_output
print(repr(out))
"""
STAGES = _MARKS + """import numpy as np
mark("numpy")
import aotc
mark("import_aotc")
from aotc.container import Container
from aotc.loading import HANDOFF_S
sys.setswitchinterval(HANDOFF_S)  # as aotc.load does while it hashes
c = Container(sys.argv[1], hash_ahead=True)
mark("map_and_start_hashing")
""" + _CHECK_TO_CALLS

# --stages with --aotc-first: the same steps in the order of AOTC_FIRST (numpy imported while the hashing runs).
STAGES_AOTC_FIRST = _MARKS + """import aotc
mark("import_aotc")
from aotc.container import Container
from aotc.loading import HANDOFF_S
sys.setswitchinterval(HANDOFF_S)  # as aotc.load does while it hashes
c = Container(sys.argv[1], hash_ahead=True)
mark("map_and_start_hashing")
try:
    from aotc.loading import import_numpy  # as aotc.load imports numpy (an older runtime: plainly)
except ImportError:
    import_numpy = lambda: None
import_numpy()
import numpy as np
mark("numpy_while_hashing")
""" + _CHECK_TO_CALLS


# --floor: what every cold start pays in CPU whatever the order or the threads, each part alone.
NUMPY_CPU = """
import os, time
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as aotc.load imports it: OpenBLAS's workers quiet
t = time.process_time()
import numpy
print(time.process_time() - t)
"""


def floor(pkg: Path, runs: int) -> dict[str, float]:
    """CPU seconds of the parts of a cold start that are not aotc's to cut: numpy's import (median of fresh
    processes), sha256 of the package's bytes from memory (the hard rule; best of 5) and mapping its pages
    (MAP_POPULATE, what the hashing's reads and the kernels' loads need at least once; best of 5)."""
    import hashlib
    import mmap

    numpy_s = statistics.median(
        float(subprocess.run([sys.executable, "-c", NUMPY_CPU], capture_output=True, text=True, check=True).stdout)
        for _ in range(runs)
    )
    data = pkg.read_bytes()
    sha, mapped = [], []
    with open(pkg, "rb") as f:
        for _ in range(5):
            t = time.process_time()
            hashlib.sha256(data).digest()
            sha.append(time.process_time() - t)
            t = time.process_time()
            m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
            mapped.append(time.process_time() - t)
            m.close()
    return {"numpy_import_cpu_s": round(numpy_s, 4), "sha256_cpu_s": round(min(sha), 4),
            "map_pages_cpu_s": round(min(mapped), 4), "bytes": len(data)}  # fmt: skip


def run_once(python: str, pkg: str, env: dict[str, str] | None = None, child: str = CHILD) -> dict[str, list[float]]:
    t = time.perf_counter()
    r = subprocess.run([python, "-c", child, pkg], capture_output=True, text=True, check=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t
    return {**ast.literal_eval(r.stdout.strip().splitlines()[-1]), "process": [wall, 0.0]}


def medians(runs: list[dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    def med(k: str, i: int) -> float:
        return round(statistics.median(r[k][i] for r in runs), 4)

    return {k: {"wall_s": med(k, 0), "cpu_s": med(k, 1)} for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pkg", type=Path)
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--baseline", default=None, help="PYTHON:PKG, another runtime and its package, timed interleaved")
    ap.add_argument("--baseline-env", action="append", default=[], help="KEY=VAL: set for the baseline's runs only")
    ap.add_argument("--env", action="append", default=[], help="KEY=VAL: also time this runtime with these variables set")
    ap.add_argument("--stages", action="store_true", help="time this runtime's aotc.load step by step (the hashing's overlap)")
    ap.add_argument("--aotc-first", action="store_true", help="also time a child that calls aotc.load before it imports numpy")
    ap.add_argument("--floor", action="store_true", help="also time the parts no order or thread count removes")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    # What `pip install` does: byte-compile the runtime (an editable install under PYTHONDONTWRITEBYTECODE
    # would otherwise recompile aotc in every new process).
    import aotc

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(aotc.__file__).parent)], capture_output=True, check=False)
    first = STAGES if args.stages else CHILD
    sides: dict[str, tuple[str, str, dict[str, str], str]] = {"this": (sys.executable, str(args.pkg), {}, first)}
    env = dict(kv.split("=", 1) for kv in args.env)
    if args.aotc_first:
        sides["this:aotc_first"] = (sys.executable, str(args.pkg), {}, STAGES_AOTC_FIRST if args.stages else AOTC_FIRST)
    if env:
        sides["this+env"] = (sys.executable, str(args.pkg), env, first)
        if args.aotc_first:
            sides["this:aotc_first+env"] = (sys.executable, str(args.pkg), env, STAGES_AOTC_FIRST if args.stages else AOTC_FIRST)
    if args.baseline:
        python, pkg = args.baseline.split(":", 1)
        base_env = dict(kv.split("=", 1) for kv in args.baseline_env)
        sides["baseline"] = (python, pkg, base_env, CHILD)
        if args.aotc_first:
            sides["baseline:aotc_first"] = (python, pkg, base_env, AOTC_FIRST)
        compile_it = "import aotc, compileall, os; compileall.compile_dir(os.path.dirname(aotc.__file__), quiet=1)"
        subprocess.run([python, "-c", compile_it], check=False, env={**os.environ, **base_env})
    doc: dict = {
        "runs": args.runs, "cores": len(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg(),
        "env": args.env, "baseline": args.baseline, "baseline_env": args.baseline_env,
    }  # fmt: skip
    for state, ctx in (("idle", contextlib.nullcontext), ("one_core_busy", busy_core)):
        got: dict[str, list] = {k: [] for k in sides}
        with ctx():
            for _ in range(args.runs):
                for k, (python, pkg, env_k, child) in sides.items():
                    got[k].append(run_once(python, pkg, env_k, child))
        doc[state] = {k: medians(v) for k, v in got.items()}
        print(state, json.dumps({k: v["import_to_output"] for k, v in doc[state].items()}), flush=True)
    if args.floor:
        # The first call's CPU (its flops) under the busy core, and the cores the process got there.
        part = floor(args.pkg, args.runs)
        busy = doc["one_core_busy"]["this"]
        part["first_call_cpu_s"] = busy["first_call"]["cpu_s"]
        total = part["numpy_import_cpu_s"] + part["sha256_cpu_s"] + part["map_pages_cpu_s"] + part["first_call_cpu_s"]
        cores = busy["import_to_output"]["cpu_s"] / busy["import_to_output"]["wall_s"]
        doc["floor"] = {**part, "sum_cpu_s": round(total, 4), "busy_cores_got": round(cores, 2),
                        "busy_floor_wall_s": round(total / cores, 4)}  # fmt: skip
        print("floor", json.dumps(doc["floor"]), flush=True)
    doc["loadavg_end"] = os.getloadavg()
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
