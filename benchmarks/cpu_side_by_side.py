"""CPU side by side: eager torch, torch.compile, ONNX Runtime and the aotc package, in one process, per model.

    python benchmarks/cpu_side_by_side.py [--models mlp,cnn,bert,mobilenet,gpt2_1,gpt2_4]
                                          [--out FILE.json] [--threads N] [--no-compile] [--no-extras]
                                          [--target cpu:native|cpu:x86-64-v3|...] [--avx2] [--precision bf16]
                                          [--bursts ON:PERIOD]

Every engine gets the same inputs and the same thread count (the machine's cores unless --threads);
fp32; each round times 30 single calls and takes their median, three rounds interleave the engines
(0.1 s apart, so that one engine's spinning threads are not the next one's neighbour), and the best round
counts. aotc packages are built for --target (cpu:native unless given; cpu:x86-64-v3 runs the AVX2 code
on an AVX-512 machine). The "vs best" ratio is the faster of
ONNX Runtime and torch.compile divided by aotc (above 1: aotc is faster); the geomean is over models.
Extras: the aotc matmul kernel at 2048^3 against torch.mm in the same process (GFLOP/s), and the cold
start of the MLP package (new process -> import aotc -> load -> first output), idle and with another
process keeping one core busy; as a script usually is (numpy imported first) and with aotc.load called
before numpy is imported (its hashing then runs beside numpy's import; ``aotc_first``). Writes JSON
with the CPU model, flags, threads, versions and date.
--avx2 stands in for an AVX2-only machine on an AVX-512 one: aotc runs its x86-64-v3 code, and torch (eager and
torch.compile: ATen, oneDNN, MKL, Inductor's vector ISA and -march) is held to AVX2 through their environment switches.
ONNX Runtime's MLAS picks its kernels by CPUID and has no such switch: where Linux offers CPUID faulting
(cpuid_fault in /proc/cpuinfo), ONNX Runtime is imported and first run with AVX-512 and AMX hidden from CPUID
(benchmarks/cpuid_mask.py), so that it sets itself up as on an AVX2-only CPU; elsewhere it keeps AVX-512 and
the ratios understate aotc against it. The JSON records which ISA each engine ran.
--precision bf16: every model in bfloat16 (the package built with --precision bf16, fed ml_dtypes bfloat16
inputs), against eager torch and torch.compile in bf16 (oneDNN's AVX512_BF16 kernels where the CPU has
them); ONNX Runtime's CPU provider has no bf16 kernels for these models, so it sits out, and the best peer is
the faster of eager and torch.compile. The 2048^3 matmul and the cold start (fp32 figures) are left out.
--bursts ON:PERIOD: the models are timed while another process spins ON ms of every PERIOD ms (a neighbour that
comes and goes, as on a shared host whose vCPUs are taken now and then): every engine meets the same neighbour.
On 2 cores the whole set takes several minutes (torch.compile and the aotc build of GPT-2 dominate).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Read by ATen, oneDNN, MKL and Inductor when torch is imported, so set before the import below.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
if "--avx2" in sys.argv:
    os.environ.update(AVX2_ENV)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from bench_timing import bursts_arg, busy_core, cpu_name  # noqa: E402
from zoo.models import FirstOutput  # noqa: E402  (the zoo's wrapper: ModelOutput -> its first tensor)

CALLS, ROUNDS = 30, 3
# Seconds of quiet before each engine's turn: ONNX Runtime's threads spin ~20 ms after its last call and
# OpenMP's (torch's) spin too, on the cores the next engine's calls want; a process serving one engine
# has no such neighbour. (aotc's first calls after ORT's once ran on one thread, its pool having seen the
# spinning: MobileNet's ratio moved 1.14-1.21 between runs. benchmarks/cpu_contention.py --neighbour
# measures that case on purpose.)
SETTLE_S = 0.1


# ---- models ----------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(1024, 4096), nn.Linear(4096, 4096), nn.Linear(4096, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(nn.functional.gelu(self.fc2(nn.functional.gelu(self.fc1(x)))))


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hid = c_in * expand
        self.use_res = stride == 1 and c_in == c_out
        self.body = nn.Sequential(
            nn.Conv2d(c_in, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, c_out, 1, bias=False), nn.BatchNorm2d(c_out),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.use_res else self.body(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 layout (width 1.0), written out so torchvision is not needed."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
        c = 32
        for t, co, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
            for i in range(n):
                layers.append(InvertedResidual(c, co, s if i == 0 else 1, t))
                c = co
        layers += [nn.Conv2d(c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


def _cnn() -> nn.Module:
    spec = importlib.util.spec_from_file_location("cnn_example", ROOT / "examples" / "cnn.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.model


def _bert() -> nn.Module:
    import transformers

    cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    return FirstOutput(transformers.BertModel(cfg))


def _gpt2() -> nn.Module:
    import transformers

    return FirstOutput(transformers.GPT2Model(transformers.GPT2Config()))


MODELS: dict[str, tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "mlp": ("MLP 1024-4096-4096-1024 GELU (64x1024)", MLP, lambda: torch.randn(64, 1024)),
    "cnn": ("small ResNet-style CNN (4x3x224x224)", _cnn, lambda: torch.randn(4, 3, 224, 224)),
    "bert": ("BERT 4 layers, hidden 256 (4x128)", _bert, lambda: torch.randint(0, 30522, (4, 128))),
    "mobilenet": ("MobileNetV2-style (1x3x224x224)", MobileNetV2, lambda: torch.randn(1, 3, 224, 224)),
    "gpt2_1": ("GPT-2 small (1x128)", _gpt2, lambda: torch.randint(0, 50257, (1, 128))),
    "gpt2_4": ("GPT-2 small (4x128)", _gpt2, lambda: torch.randint(0, 50257, (4, 128))),
}


# ---- engines ---------------------------------------------------------------------------------------------


def _aotc(
    model: nn.Module, x: torch.Tensor, name: str, work: Path, threads: int, target: str = "cpu:native", precision: str = "fp32"
) -> tuple[Callable[[], object], dict]:
    import aotc
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, parse_target

    t0 = time.perf_counter()
    cap = capture_module(model, (x,), name=name, precision=precision)
    pkg = work / f"{name}.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(parse_target(target),), selftest=False, precision=precision))
    build_s = time.perf_counter() - t0
    m = aotc.load(pkg, device="cpu", num_threads=threads)
    xn = x.float().numpy().astype(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 else x.numpy()
    return (lambda: m(xn)), {"build_s": round(build_s, 1), "package": str(pkg)}


def _ort(model: nn.Module, x: torch.Tensor, work: Path, threads: int) -> Callable[[], object]:
    import onnxruntime as ort

    path = work / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    return lambda: sess.run(None, feed)


def _rounds(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best of ROUNDS interleaved rounds of the median of CALLS single calls, in ms; SETTLE_S apart."""
    best = dict.fromkeys(fns, math.inf)
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            time.sleep(SETTLE_S)
            fn()
            ts = []
            for _ in range(CALLS):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            best[name] = min(best[name], statistics.median(ts) * 1e3)
    return best


def _close(got: object, want: torch.Tensor) -> float:
    g = np.asarray(got[0] if isinstance(got, list | tuple) else got, dtype=np.float64)
    w = want.double().numpy()
    return float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-6))


def calibrate_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Batch-norm statistics from the batch ``x``, as training would leave them. The defaults (mean 0,
    variance 1) let a deep randomly initialised network's activations die out layer by layer, so that its
    output no longer depends on its input and an error check against eager proves nothing."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: after one batch, that batch's statistics
    if bns:
        model.train()
        with torch.no_grad():
            model(x)
    model.eval()


def prepared(make: Callable[[], nn.Module], inputs: Callable[[], torch.Tensor]) -> tuple[nn.Module, torch.Tensor]:
    """A model in eval mode with its batch-norm statistics calibrated, and an input, seeded: what every CPU
    benchmark builds and times. Uncalibrated, MobileNetV2's activations shrink block by block into
    denormals, on which the package took 1.6x the CPU time a call (and ONNX Runtime more)."""
    torch.manual_seed(0)
    model = make()
    calibrate_bn(model, inputs())
    return model, inputs()


def bench_model(key: str, threads: int, compile_: bool, target: str = "cpu:native", precision: str = "fp32") -> dict:
    title, make, inputs = MODELS[key]
    model, x = prepared(make, inputs)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
        x = x.to(torch.bfloat16) if x.is_floating_point() else x
    row: dict = {"model": key, "title": title}
    fns: dict[str, Callable[[], object]] = {}
    with torch.no_grad():
        want = model(x)
        fns["eager"] = lambda: model(x)
        if compile_:
            t0 = time.perf_counter()
            compiled = torch.compile(model)
            compiled(x)
            row["compile_s"] = round(time.perf_counter() - t0, 1)
            fns["torch.compile"] = lambda: compiled(x)
    work = Path(tempfile.mkdtemp(prefix="side_"))
    if precision != "fp32":
        row["ort_note"] = f"ONNX Runtime's CPU provider has no {precision} kernels for this model"
    else:
        try:
            ort_fn = _ort(model, x, work, threads)
            row["ort_rel_err"] = _close(ort_fn(), want)
            fns["onnxruntime"] = ort_fn
        except Exception as e:
            row["ort_note"] = f"{type(e).__name__}: {str(e)[:200]}"
    aotc_fn, info = _aotc(model, x, key, work, threads, target, precision)
    row.update(info)
    row["aotc_rel_err"] = _close(aotc_fn(), want)
    fns["aotc"] = aotc_fn
    with torch.no_grad():
        row["ms"] = {k: round(v, 3) for k, v in _rounds(fns).items()}
    names = ("onnxruntime", "torch.compile") if precision == "fp32" else ("eager", "torch.compile")
    peers = [row["ms"][k] for k in names if k in row["ms"]]
    if peers:
        row["best_peer_over_aotc"] = round(min(peers) / row["ms"]["aotc"], 3)
    return row


# ---- extras ----------------------------------------------------------------------------------------------


def bench_matmul(threads: int, target: str = "cpu:native") -> dict:
    """The aotc matmul kernel (through a one-matmul package) against torch.mm, 2048^3 fp32."""
    n = 2048
    torch.manual_seed(0)
    lin = nn.Linear(n, n, bias=False).eval()
    x = torch.randn(n, n)
    fn, _ = _aotc(lin, x, "matmul2048", Path(tempfile.mkdtemp(prefix="side_")), threads, target)
    w = lin.weight.detach().t().contiguous()
    ms = _rounds({"aotc": fn, "torch.mm": lambda: torch.mm(x, w)})
    gf = {k: round(2 * n**3 / (v * 1e-3) / 1e9, 1) for k, v in ms.items()}
    return {"ms": ms, "gflops": gf, "aotc_over_torch": round(gf["aotc"] / gf["torch.mm"], 3)}


COLD = """
import time, sys
t0 = time.perf_counter()
import numpy as np, aotc
m = aotc.load(sys.argv[1], device="cpu")
y = m(np.zeros((64, 1024), np.float32))
print(time.perf_counter() - t0)
"""

COLD_AOTC_FIRST = """
import time, sys
t0 = time.perf_counter()
import aotc
m = aotc.load(sys.argv[1], device="cpu")
import numpy as np
y = m(np.zeros((64, 1024), np.float32))
print(time.perf_counter() - t0)
"""


def bench_cold_start(pkg: str, runs: int = 11) -> dict:
    """Seconds from a new process to the first output: wall time of the child, and its own import->output."""
    out = {}
    # What `pip install` does: byte-compile the runtime. An editable install under PYTHONDONTWRITEBYTECODE
    # (set on the CI machines) would otherwise recompile ~3000 lines of aotc in every new process.
    import aotc

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(aotc.__file__).parent)], capture_output=True, check=False)
    for label, ctx in (("idle", contextlib.nullcontext), ("one_core_busy", busy_core)):
        walls: dict[str, list[float]] = {"": [], "aotc_first_": []}
        inner: dict[str, list[float]] = {"": [], "aotc_first_": []}
        with ctx():
            for _ in range(runs):  # the two orders interleaved, so that both see the same load
                for key, child in (("", COLD), ("aotc_first_", COLD_AOTC_FIRST)):
                    t = time.perf_counter()
                    r = subprocess.run([sys.executable, "-c", child, pkg], capture_output=True, text=True, check=True)
                    walls[key].append(time.perf_counter() - t)
                    inner[key].append(float(r.stdout.strip().splitlines()[-1]))
        figures = (("process_s", walls), ("import_to_output_s", inner))
        out[label] = {f"{k}{what}": round(statistics.median(v[k]), 3) for k in walls for what, v in figures}
    return out


# ---- main ------------------------------------------------------------------------------------------------


def _cpu() -> dict:
    from aotc.cpu_features import cpu_flags, cpu_level

    return {"model": cpu_name(), "cores": os.cpu_count(), "level": cpu_level(), "flags": sorted(cpu_flags())}


def _ort_held_to_avx2() -> str:
    """Import ONNX Runtime and run a first session with AVX-512/AMX hidden from CPUID, so that MLAS picks its
    AVX2 kernels for the whole process; says what ONNX Runtime runs."""
    import cpuid_mask

    if "onnxruntime" in sys.modules:
        return "the machine's best (imported before the CPUID mask could apply)"
    if not cpuid_mask.available():
        return "the machine's best: no CPUID faulting here to hide AVX-512 from MLAS"
    path = Path(tempfile.mkdtemp(prefix="side_")) / "first.onnx"
    torch.onnx.export(nn.Linear(64, 64).eval(), (torch.randn(4, 64),), str(path), dynamo=False, opset_version=17)
    with cpuid_mask.cpuid_masked():
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        sess.run(None, {sess.get_inputs()[0].name: np.ones((4, 64), np.float32)})
    return f"AVX2: MLAS set up with AVX-512/AMX hidden from CPUID ({cpuid_mask.trapped()} CPUID calls answered)"


def _versions() -> dict:
    import aotc

    out = {"aotc": aotc.__version__, "torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__}
    for mod in ("onnxruntime", "onnx", "transformers"):
        with contextlib.suppress(ImportError):
            out[mod] = __import__(mod).__version__
    out["gcc"] = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to build on few cores)")
    ap.add_argument("--no-extras", action="store_true", help="skip the 2048^3 matmul and the cold start")
    ap.add_argument("--target", default="cpu:native", help="the aotc package's CPU target (cpu:x86-64-v3: the AVX2 code)")
    ap.add_argument("--avx2", action="store_true", help="stand in for an AVX2-only CPU: aotc x86-64-v3, torch held to AVX2")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: every engine in bfloat16 (ORT sits out)")
    ap.add_argument("--bursts", type=bursts_arg, default=None, metavar="ON:PERIOD",
                    help="time the models beside a process spinning ON ms of every PERIOD")  # fmt: skip
    args = ap.parse_args()
    bursts = args.bursts
    if args.precision != "fp32":
        args.no_extras = True  # the 2048^3 matmul and the cold start are fp32 figures
    ort_isa = "MLAS picks by CPUID (no switch): the machine's best"
    inductor_march = "x86-64-v3"
    if args.avx2:
        import torch._inductor.config as inductor_config

        ort_isa = _ort_held_to_avx2()  # before anything else imports onnxruntime

        args.target = "cpu:x86-64-v3"
        try:
            inductor_config.cpp.march = "x86-64-v3"  # Inductor's g++ line, which is -march=native otherwise
        except AttributeError:  # torch before 2.12: its vector code still follows ATEN_CPU_CAPABILITY
            inductor_march = "native (this torch has no cpp.march; its vector code follows ATEN_CPU_CAPABILITY)"
    torch.set_num_threads(args.threads)
    cpu = _cpu()
    doc: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
        "threads": args.threads, "versions": _versions(),
        "method": f"{args.precision}; per engine the median of {CALLS} single calls; best of {ROUNDS} interleaved rounds, "
                  f"{SETTLE_S} s of quiet before each engine's turn; aotc built for {args.target}; best_peer_over_aotc = "
                  + ("min(ORT, torch.compile) / aotc" if args.precision == "fp32" else "min(eager, torch.compile) / aotc"),
        "precision": args.precision,
        "rows": [], "notes": [], "loadavg_start": os.getloadavg(),
        "isa": {"aotc": args.target, "torch": torch.backends.cpu.get_cpu_capability(),
                "onnxruntime": ort_isa},
    }  # fmt: skip
    if args.avx2:
        doc["notes"].append(f"--avx2: torch held to AVX2 through {AVX2_ENV}, Inductor's -march {inductor_march}; "
                            f"ONNX Runtime: {ort_isa}")
    if args.no_compile:
        doc["notes"].append("torch.compile skipped (--no-compile)")
    if bursts:
        doc["notes"].append(f"--bursts: models timed beside a process spinning {bursts[0]:g} ms of every {bursts[1]:g} ms")
        doc["bursts_ms"] = list(bursts)
    with busy_core(bursts) if bursts else contextlib.nullcontext():
        for key in args.models.split(","):
            row = bench_model(key.strip(), args.threads, not args.no_compile, args.target, args.precision)
            doc["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "package"}), flush=True)
    ratios = [r["best_peer_over_aotc"] for r in doc["rows"] if "best_peer_over_aotc" in r]
    if ratios:
        doc["geomean_best_peer_over_aotc"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
    if not args.no_extras:
        doc["matmul_2048"] = bench_matmul(args.threads, args.target)
        print(json.dumps(doc["matmul_2048"]), flush=True)
        mlp = next((r["package"] for r in doc["rows"] if r["model"] == "mlp"), None)
        if mlp is None:
            _, info = _aotc(MLP().eval(), torch.randn(64, 1024), "mlp", Path(tempfile.mkdtemp(prefix="side_")), args.threads)
            mlp = info["package"]
        doc["cold_start_mlp"] = bench_cold_start(mlp)
        print(json.dumps(doc["cold_start_mlp"]), flush=True)
    doc["loadavg_end"] = os.getloadavg()  # other processes on the machine skew every engine's times
    for r in doc["rows"]:
        r.pop("package", None)
    day = doc["date"][:10]
    cpu_tag = "".join(c if c.isalnum() else "_" for c in cpu["model"]).strip("_")[:40]
    tag = "" if args.precision == "fp32" else f"_{args.precision}"
    out = args.out or ROOT / "benchmarks" / "results" / f"cpu_side_by_side_{day}_{cpu_tag}{tag}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{'model':10s} " + " ".join(f"{k:>13s}" for k in ("eager", "torch.compile", "onnxruntime", "aotc", "peer/aotc")))
    for r in doc["rows"]:
        cells = [f"{r['ms'].get(k, float('nan')):13.2f}" for k in ("eager", "torch.compile", "onnxruntime", "aotc")]
        print(f"{r['model']:10s} " + " ".join(cells) + f" {r.get('best_peer_over_aotc', float('nan')):13.2f}")
    print(f"geomean peer/aotc: {doc.get('geomean_best_peer_over_aotc')}; wrote {out}")


if __name__ == "__main__":
    main()
