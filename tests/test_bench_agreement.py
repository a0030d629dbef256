"""``aotc bench`` measures what the benchmarks/ scripts measure. On the same package and inputs, in one
process, rounds interleaved: its mean agrees with ``benchmarks/bench_timing.median_ms`` (the loop
cpu_latency.py, cpu_side_by_side.py and the GPU scripts share: the median over repeats of the mean time per
call of back-to-back calls), and its p50 with the same loop timing one call at a time. On a quiet machine
the two statistics coincide; on a busy one the means include preempted calls and p50 does not, which is why
``aotc bench`` prints both (docs/bench.md, "Agreement with benchmarks/")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from aotc.bench import run_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_timing import median_ms  # noqa: E402

SHAPES = {"mlp": (64, 256), "cnn": (4, 3, 32, 32)}  # the examples at a batch a benchmark would run
# "within noise" on a shared 2-core machine: medians measured 0.67-1.37 at load 13 (docs/bench.md); a timing
# bug (a missing sync, load time counted, the wrong divisor) lands far outside
AGREE = (0.5, 2.0)


def agreement(pkg: Path, shape: tuple[int, ...], threads: int = 1, rounds: int = 3, stat=np.median) -> dict[str, float]:
    """``stat`` over ``rounds`` interleaved rounds: aotc bench's mean and p50, the benchmark loop's figure
    (back-to-back calls) and the same loop one call at a time, in ms."""
    import aotc

    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    m = aotc.load(pkg, device="cpu", num_threads=threads)
    got: dict[str, list[float]] = {"bench_mean": [], "bench_p50": [], "loop": [], "loop_single": []}
    for _ in range(rounds):
        r = run_bench(pkg, "cpu", threads, {"x": shape}, {}, warmup=5, iterations=50)
        got["bench_mean"].append(r.mean_ms)
        got["bench_p50"].append(r.p50_ms)
        got["loop"].append(median_ms(lambda: m(x), repeats=5, min_time=0.1))
        got["loop_single"].append(median_ms(lambda: m(x), repeats=50, calls=1))
    m.close()
    return {k: float(stat(v)) for k, v in got.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_bench_agrees_with_the_benchmark_loop(name: str, tmp_path: Path, aotc_cache: Path) -> None:
    from serve_util import build_example

    # The fastest of 5 rounds: the suite runs one pytest worker per core, so a round can lose half its time
    # to a g++ next door (CI saw the loop's median at 2.1x its fastest round); preemption only adds time.
    a = agreement(build_example(name, tmp_path, aotc_cache), SHAPES[name], rounds=5, stat=np.min)
    for mine, theirs in (("bench_mean", "loop"), ("bench_p50", "loop_single")):
        assert AGREE[0] <= a[mine] / a[theirs] <= AGREE[1], f"{name}: {mine} {a[mine]:.3f} ms vs {theirs} {a[theirs]:.3f} ms ({a})"


if __name__ == "__main__":  # python tests/test_bench_agreement.py [DIR]: the figures docs/bench.md quotes
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from serve_util import build_example

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    for name, shape in sorted(SHAPES.items()):
        pkg = build_example(name, out, out / "cache")
        for threads in (1, 2):
            a = agreement(pkg, shape, threads)
            print(f"| {name} {'x'.join(map(str, shape))} | {threads} | {a['bench_mean']:.3f} | {a['loop']:.3f} | "
                  f"{a['bench_p50']:.3f} | {a['loop_single']:.3f} |")  # fmt: skip
