"""A/B of the fused inverted-residual block (cpp_templates/conv_dw.h and the kernels it calls) on MobileNetV2's
17 blocks, per block, interleaved.

    python benchmarks/cpu_block_ab.py [--level x86-64-v3] [--threads 1] [--base REV] [--variant NAME=-DX=1,-DY=2 ...]
        [--rounds 6] [--reps 60] [--out F.json]

Each variant is benchmarks/block_ab.cpp built into its own executable with a package's flags for --level: the
working tree's templates with the variant's -D flags, or with --base REV the templates of git revision REV as
variant "base". A round runs every variant once in turn (each: the 17 blocks in sequence --reps times, as in a
call of the model, the median per block); the report is the median over rounds per block and in total, and
each variant's ratio to the first. A package A/B (cpu_model_ab.py) takes minutes of builds per change and moves
1-2% between runs; this builds in ~20 s and shows which block moved. Rounds interleave, but the host's speed
drifts: two identical variants (``--variant a= --variant b=``) show the noise (~1-2% in total here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_timing import cpu_name  # noqa: E402
from cpu_matmul_ab import FLAGS, base_templates  # noqa: E402

HARNESS = ROOT / "benchmarks" / "block_ab.cpp"


def build(name: str, templates: Path, level: str, defines: list[str], work: Path) -> Path:
    out = work / f"block_ab_{name}"
    arch = [f"-march={level}"] + (["-mprefer-vector-width=512"] if level == "x86-64-v4" else [])
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC", "-fvisibility=hidden")]
    subprocess.run(["g++", *flags, *arch, *defines, f"-I{templates}", str(HARNESS), "-o", str(out)], check=True)
    return out


def run(exe: Path, threads: int, reps: int) -> tuple[list[str], list[float]]:
    """(block labels, median ms per block) of one run of ``exe``."""
    out = subprocess.run([str(exe), str(threads), str(reps)], check=True, capture_output=True, text=True).stdout
    labels, ms = [], []
    for line in out.splitlines():
        f = line.split()
        if f[0] == "total":
            continue
        labels.append(f"{f[1]}->{f[3]}->{f[4]} {f[2]}x{f[2]} s{f[5]}")
        ms.append(float(f[6]))
    return labels, ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--level", default="x86-64-v3", help="the package CPU level to build for (x86-64-v3: AVX2)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base", default="", help="git revision whose templates are variant 'base' (listed first)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=-DX=1,-DY=2 (the working tree's templates)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=60, help="passes over the 17 blocks per run")
    ap.add_argument("--out", type=Path, default=None, help="write the per-block medians here (JSON)")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1 or args.threads < 1:
        ap.error("--rounds, --reps and --threads: 1 or more")
    work = Path(tempfile.mkdtemp(prefix="block_ab_"))
    exes: dict[str, Path] = {}
    if args.base:
        exes["base"] = build("base", base_templates(args.base, work), args.level, [], work)
    for v in args.variant or ["tree="]:
        name, _, defs = v.partition("=")
        if name in exes:
            ap.error(f"--variant {name}: named twice")
        exes[name] = build(name, ROOT / "cpp_templates", args.level, [d for d in defs.split(",") if d], work)
    per: dict[str, list[list[float]]] = {n: [] for n in exes}
    labels: list[str] = []
    for _ in range(args.rounds):
        for name, exe in exes.items():
            time.sleep(0.05)
            labels, ms = run(exe, args.threads, args.reps)
            per[name].append(ms)
    med = {n: [statistics.median(r[i] for r in rounds) for i in range(len(labels))] for n, rounds in per.items()}
    totals = {n: statistics.median(sum(r) for r in rounds) for n, rounds in per.items()}
    first = next(iter(exes))
    names = list(exes)
    print(f"{args.level}, {args.threads} thread(s), {args.rounds} rounds x {args.reps} passes; ms, median per block")
    print(f"{'block':<26}" + "".join(f"{n:>12}" for n in names) + "".join(f"{n + '/' + first:>14}" for n in names[1:]))
    for i, label in enumerate(labels):
        row = "".join(f"{med[n][i]:12.4f}" for n in names)
        row += "".join(f"{med[n][i] / med[first][i]:14.3f}" for n in names[1:])
        print(f"{label:<26}{row}")
    row = "".join(f"{totals[n]:12.4f}" for n in names) + "".join(f"{totals[n] / totals[first]:14.3f}" for n in names[1:])
    print(f"{'total':<26}{row}")
    if args.out:
        doc = {
            "date": time.strftime("%Y-%m-%d"), "level": args.level, "threads": args.threads, "rounds": args.rounds,
            "reps": args.reps, "cpu": cpu_name(), "variants": sys.argv[1:],
            "blocks": labels, "ms": med, "total_ms": totals,
        }  # fmt: skip
        args.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
