"""ONNX Runtime alone beside a neighbour that comes and goes: its thread pool with spinning on (its default) and
off, at one and two threads, idle and while another process spins ON ms of every PERIOD ms.

    python benchmarks/ort_neighbour.py [--model mobilenet] [--bursts 4:10] [--rounds 3] [--calls 30]

Why: beside such a neighbour (``cpu_side_by_side.py --bursts``) ONNX Runtime's MobileNetV2 kept its idle time
while aotc's grew ~15%; this tells whether ONNX Runtime's spinning workers are what keeps it there. Each cell:
the median of ``--calls`` single calls, best of ``--rounds``, in ms; no aotc in the process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort
import torch
from bench_timing import bursts_arg, busy_core
from cpu_side_by_side import MODELS, prepared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet", choices=list(MODELS))
    ap.add_argument("--bursts", type=bursts_arg, default="4:10", metavar="ON:PERIOD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    on, period = args.bursts
    _, make, inputs = MODELS[args.model]
    model, x = prepared(make, inputs)
    path = Path(tempfile.mkdtemp(prefix="ort_neighbour_")) / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    for threads in (1, 2):
        for spin in (True, False):
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x.numpy()}
            cells = {}
            for label, bursts in (("idle", None), ("bursts", (on, period))):
                with busy_core(bursts) if bursts else contextlib.nullcontext():
                    best = float("inf")
                    for _ in range(args.rounds):
                        times = []
                        for _ in range(args.calls):
                            t = time.perf_counter()
                            sess.run(None, feed)
                            times.append(time.perf_counter() - t)
                        best = min(best, statistics.median(times))
                        time.sleep(0.1)
                cells[label] = round(best * 1e3, 2)
            print(f"{args.model}: threads {threads}, spinning {'on ' if spin else 'off'}: idle {cells['idle']:.2f} ms, "
                  f"beside {on:g} of every {period:g} ms {cells['bursts']:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
