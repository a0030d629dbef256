"""A/B of the CPU attention kernel alone (cpp_templates/attention.h): a git revision's templates against the
working tree's, interleaved in one process, at the transformers' shapes.

    python benchmarks/attention_ab.py [--base REV[,REV2...]] [--dirs NAME=DIR,...] [--level x86-64-v4|x86-64-v3]
        [--threads 1,2] [--cases bert,bert_pad,gpt2_1,gpt2_4] [--rounds 15] [--reps 20] [--json OUT.json]

Each variant is benchmarks/attention_ab.cpp built into its own library (the flags of aot/compile.py at
--level) with the templates of each REV (named by it; default HEAD), of each DIR (named NAME: revisions
exported beforehand, for a machine without the git history), and of the working tree ("tree"); ratios and
bit-identity are against the first variant. Cases
read q/k/v as generated code reads them, heads of one fused QKV projection (attention_ab.cpp):
  bert      4x4 heads, 128 tokens, head dim 64, the bool mask along the queries only that BERT's exported
            extended mask becomes (all ones, as for unpadded input)
  bert_pad  the same with a key-padding bool mask [4, 1, 1, 128] (lengths 128, 105, 82, 59)
  gpt2_1    GPT-2 small's causal attention, 1x12 heads, 128 tokens, 64
  gpt2_4    the same at batch 4
  heads_pad, heads_causal  BERT's shape on separate contiguous q/k/v [B, H, L, E] (SDPA called on tensors
            of its own, attention_cpu.py's cases): key-padded, causal
Every round calls each variant in turn (after a pause, so that the other variant's pool workers are asleep)
for --reps calls and keeps the median call; the figure (``ms``) is the median over rounds of the calls' CPU
time on one thread (it leaves out the time slices that other processes take on a loaded machine) and of
their wall time on more (on a machine whose cores are busy the second thread's share comes and goes:
compare interleaved medians only, next to the 1-thread figure); wall time beside it. Outputs are checked
against a float64 reference and against each other (bit-identical or the largest difference).
The dirs form: python benchmarks/attention_ab.py --base "" --dirs before=/tmp/t0,after=/tmp/t1 ...
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from cpu_matmul_ab import base_templates  # benchmarks/ is this script's folder

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "benchmarks" / "attention_ab.cpp"
# as aot/compile.py
FLAGS = ["-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off"]
FLAGS += ["-fno-math-errno", "-fno-trapping-math"]
# name: (batch, heads, tokens, head dim, causal, mask_by, fused QKV)
CASES = {"bert": (4, 4, 128, 64, 0, 1, 1), "bert_pad": (4, 4, 128, 64, 0, 2, 1), "gpt2_1": (1, 12, 128, 64, 1, 0, 1),
         "gpt2_4": (4, 12, 128, 64, 1, 0, 1), "heads_pad": (4, 4, 128, 64, 0, 2, 0),
         "heads_causal": (4, 4, 128, 64, 1, 0, 0)}  # fmt: skip


def build(name: str, templates: Path, level: str, work: Path) -> ctypes.CDLL:
    out = work / f"attn_ab_{name}_{level}.so"
    arch = [f"-march={level}"] + (["-mprefer-vector-width=512"] if level == "x86-64-v4" else [])
    subprocess.run(["g++", *FLAGS, *arch, f"-I{templates}", str(HARNESS), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    i64, i, p = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.ab_attn.argtypes = [i64, i64, i64, i64, i64, i64, i, i, p, p, p, i, i, p]
    lib.ab_attn.restype = None
    return lib


def reference(qkv: np.ndarray, mask: np.ndarray | None, case: tuple[int, ...]) -> np.ndarray:
    b, h, n, e, causal, mask_by, fused = case
    x = qkv.astype(np.float64)
    x = x.reshape(b, n, 3, h, e).transpose(2, 0, 3, 1, 4) if fused else x.reshape(3, b, h, n, e)  # [3, B, H, L, E]
    s = x[0] @ x[1].swapaxes(-1, -2) / np.sqrt(e)
    keep = np.ones((b, 1, n, n), bool)
    if causal:
        keep &= np.tri(n, dtype=bool)
    if mask_by == 2 and mask is not None:
        keep &= mask.reshape(b, 1, 1, n)
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ x[2]
    return o.transpose(0, 2, 1, 3).reshape(b, n, h * e)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--dirs", default="")
    ap.add_argument("--level", default="x86-64-v4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attn_ab_"))
    libs = {}
    for rev in (r for r in args.base.split(",") if r):
        libs[rev] = build(rev.replace("/", "_"), base_templates(rev, work), args.level, work)
    for item in (d for d in args.dirs.split(",") if d):
        name, _, path = item.partition("=")
        libs[name] = build(name, Path(path).resolve(), args.level, work)
    libs["tree"] = build("tree", ROOT / "cpp_templates", args.level, work)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for name in args.cases.split(","):
            row = bench(libs, name, CASES[name], threads, args.rounds, args.reps)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        gxx = subprocess.run(["g++", "--version"], check=True, capture_output=True, text=True).stdout.splitlines()[0]
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "cpu": _cpu_model(), "level": args.level, "flags": FLAGS, "g++": gxx, "numpy": np.__version__,
               "python": platform.python_version(), "variants": list(libs), "rounds": args.rounds, "reps": args.reps,
               "measure": "median over interleaved rounds of each round's median call; ms: CPU time on 1 thread, wall on more",
               "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def bench(libs: dict[str, ctypes.CDLL], name: str, case: tuple[int, ...], threads: int, rounds: int, reps: int) -> dict:
    b, h, n, e, causal, mask_by, fused = case
    rng = np.random.default_rng(0)
    ld = 3 * h * e if fused else 0
    qkv = rng.standard_normal((b, n, 3 * h * e), dtype=np.float32)
    mask = None
    if mask_by == 1:
        mask = np.ones(n, bool)
    elif mask_by == 2:
        mask = np.arange(n)[None, :] < np.array([n - 23 * j for j in range(b)])[:, None]
    outs = {v: np.zeros((b, n, h * e), np.float32) for v in libs}
    secs = np.zeros(2 * max(reps, 3))  # the warm-up call below times 3

    def call(v: str, count: int) -> tuple[float, float]:
        time.sleep(0.005)  # the other library's pool workers stop spinning (50 us) and sleep
        m = mask.ctypes.data if mask is not None else None
        libs[v].ab_attn(b, h, n, n, e, ld, causal, mask_by, qkv.ctypes.data, m, outs[v].ctypes.data, threads, count,
                        secs.ctypes.data)  # fmt: skip
        return statistics.median(secs[0 : 2 * count : 2]), statistics.median(secs[1 : 2 * count : 2])

    for v in libs:
        call(v, 3)  # warm
    cpu: dict[str, list[float]] = {v: [] for v in libs}
    wall: dict[str, list[float]] = {v: [] for v in libs}
    for _ in range(rounds):
        for v in libs:
            c, w = call(v, reps)
            cpu[v].append(c)
            wall[v].append(w)
    want = reference(qkv, mask, case)
    row: dict = {"case": name, "threads": threads}
    for v in libs:
        row[f"{v}_ms"] = round(statistics.median(cpu[v]) * 1e3, 4)
        row[f"{v}_wall_ms"] = round(statistics.median(wall[v]) * 1e3, 4)
        row[f"{v}_err"] = float(np.abs(outs[v] - want).max())
    first = next(iter(libs))
    for v in list(libs)[1:]:
        row[f"{v}_vs_{first}"] = round(row[f"{first}_ms"] / row[f"{v}_ms"], 3)
        row[f"{v}_bit_identical"] = bool(np.array_equal(outs[v].view(np.uint32), outs[first].view(np.uint32)))
        row[f"{v}_max_diff"] = float(np.abs(outs[v] - outs[first]).max())
    return row


if __name__ == "__main__":
    main()
    sys.exit(0)
