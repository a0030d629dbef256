"""`aotc serve` throughput and latency against a plain Python loop calling the package.

    python benchmarks/serve_throughput.py [OUT.json] [--packages DIR] [--seconds S] [--rounds R] [--protocols grpc,http]

Builds the examples (`--target cpu` unless --target says otherwise, into DIR; reused when present), then for each:
- loop: one Python thread calling ``model(x)`` on single-row inputs back to back (no server, no copies over a
  socket): the ceiling for one request at a time; and ``model(x)`` on a batch of 8 and 32 rows (per-row time),
  the ceiling batching can approach;
- serve: `aotc serve` in its own process, and 1, 8 and 32 concurrent clients (coroutines of tritonclient's
  asyncio gRPC / HTTP clients in this process) each sending single-row requests back to back for S seconds.
Reports requests/s and per-request p50/p99 latency (ms). The clients share the machine with the server: on two
cores they take a large part of it, so the figures are a floor for the server, not a ceiling. Writes JSON with
the load average before and after, versions and date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_timing import cpu_name  # noqa: E402

EXAMPLES = ("mlp", "cnn", "transformer")
CONCURRENCY = (1, 8, 32)


def _input(name: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    if name == "mlp":
        return rng.standard_normal((rows, 256)).astype(np.float32)
    if name == "cnn":
        return rng.standard_normal((rows, 3, 32, 32)).astype(np.float32)
    return rng.integers(0, 1000, (rows, 64)).astype(np.int64)


def _stats(lat: list[float], seconds: float) -> dict[str, float]:
    a = np.asarray(lat) * 1e3
    return {"requests": len(lat), "rps": round(len(lat) / seconds, 1), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3)}  # fmt: skip


def loop_baseline(model, name: str, seconds: float) -> dict[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    host = model.executor.to_host  # the outputs in host memory, as the server sends them (a copy on CUDA)
    out = {}
    for rows in (1, 8, 32):
        feeds = {model.inputs[0].name: _input(name, rows, rng)}
        [host(v) for v in model.run(feeds).values()]
        lat, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            [host(v) for v in model.run(feeds).values()]
            lat.append((time.perf_counter() - t) / rows)
        out[f"loop_batch{rows}"] = _stats(lat, sum(lat))  # per row: rps is rows per second
    return out


async def _clients(protocol: str, url: str, name: str, concurrency: int, seconds: float) -> dict[str, float]:
    if protocol == "grpc":
        import tritonclient.grpc.aio as client_mod
    else:
        import tritonclient.http.aio as client_mod  # type: ignore[no-redef]
    client = client_mod.InferenceServerClient(url)
    rng = np.random.default_rng(1)
    xs = [_input(name, 1, rng) for _ in range(16)]
    in_name = {"mlp": "x", "cnn": "x", "transformer": "tokens"}[name]
    dtype = "INT64" if name == "transformer" else "FP32"

    def request(x: np.ndarray):  # type: ignore[no-untyped-def]
        inp = client_mod.InferInput(in_name, list(x.shape), dtype)
        inp.set_data_from_numpy(x)
        return [inp]

    lat: list[float] = []

    async def one(k: int, end: float) -> None:
        i = k
        while time.perf_counter() < end:
            t = time.perf_counter()
            await client.infer(name, request(xs[i % len(xs)]))
            lat.append(time.perf_counter() - t)
            i += 1

    await asyncio.gather(*(one(k, time.perf_counter() + 0.3) for k in range(concurrency)))  # warm up
    lat.clear()
    start = time.perf_counter()
    await asyncio.gather(*(one(k, start + seconds) for k in range(concurrency)))
    elapsed = time.perf_counter() - start
    await client.close()
    return _stats(lat, elapsed)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux): what the server spent, whatever else ran on the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(pkgs: dict[str, Path], log: Path, device: str) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    cmd = [sys.executable, "-c", "from aotc.cli import main; main()", "serve", *map(str, pkgs.values())]
    cmd += ["--http-port", "0", "--grpc-port", "0", "--device", device]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    for _ in range(1200):
        for line in log.read_text().splitlines():
            if '"listening"' in line:
                return proc, json.loads(line)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"aotc serve did not start:\n{log.read_text()}")


def serve_point(proc: subprocess.Popen[bytes], ports: dict[str, int], protocol: str, name: str, c: int, seconds: float) -> dict[str, float]:
    cpu = _cpu_seconds(proc.pid)
    r = asyncio.run(_clients(protocol, f"127.0.0.1:{ports[protocol + '_port']}", name, c, seconds))
    # The warm-up requests are in the CPU time too; they are few next to the timed ones.
    r["server_cpu_ms_per_request"] = round((_cpu_seconds(proc.pid) - cpu) * 1e3 / max(r["requests"], 1), 3)
    return r


def batch_rows(ports: dict[str, int], names: list[str]) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ports['http_port']}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    got = {}
    for line in text.splitlines():
        for name in names:
            for part in ("sum", "count"):
                if line.startswith(f'aotc_batch_rows_{part}{{model="{name}"}}'):
                    got[name, part] = float(line.split()[-1])
    return {n: round(got[n, "sum"] / got[n, "count"], 2) for n in names if got.get((n, "count"))}


def _better(old: dict[str, float] | None, new: dict[str, float]) -> dict[str, float]:
    return new if old is None or new["rps"] > old["rps"] else old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=str(ROOT / "benchmarks" / "results" / f"serve_throughput_{datetime.date.today()}.json"))
    ap.add_argument("--packages", default=str(ROOT / ".bench-pkgs"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", default="cpu", help="aotc build --target for the packages (e.g. cpu,cuda:sm_90)")
    ap.add_argument("--device", default="cpu", help="device of the loop and of the server (cpu, cuda, auto)")
    args = ap.parse_args()
    pkg_dir = Path(args.packages)
    pkg_dir.mkdir(parents=True, exist_ok=True)
    names = args.examples.split(",")
    pkgs = {}
    for name in names:
        pkgs[name] = pkg_dir / f"{name}.pkg"
        if not pkgs[name].exists():
            subprocess.run([sys.executable, "-c", "from aotc.cli import main; main()", "build", str(ROOT / "examples" / f"{name}.py"),
                            "-o", str(pkgs[name]), "--target", args.target], check=True)  # fmt: skip
    import aotc

    load_before = os.getloadavg()
    models = {name: aotc.load(p, device=args.device) for name, p in pkgs.items()}
    proc, ports = start_server(pkgs, pkg_dir / "serve.log", args.device)
    results: dict[str, dict] = {name: {} for name in names}
    try:
        for rnd in range(args.rounds):  # loop and server interleaved; each point keeps its best round
            print(f"round {rnd + 1}/{args.rounds} (load {os.getloadavg()[0]:.1f})", flush=True)
            for name in names:
                for k, v in loop_baseline(models[name], name, args.seconds).items():
                    results[name][k] = _better(results[name].get(k), v)
                    print(f"  {name:12} {k:15} {v['rps']:>8.1f} rows/s  p50 {v['p50_ms']:.3f} ms/row", flush=True)
                for protocol in args.protocols.split(","):
                    for c in CONCURRENCY:
                        r = serve_point(proc, ports, protocol, name, c, args.seconds)
                        key = f"serve_{protocol}_c{c}"
                        results[name][key] = _better(results[name].get(key), r)
                        line = f"{r['rps']:>8.1f} req/s   p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms"
                        cpu = f"server CPU {r['server_cpu_ms_per_request']:.3f} ms/req"
                        print(f"  {name:12} {protocol:4} c={c:<3}    {line}  {cpu}", flush=True)
        rows = batch_rows(ports, names)
        for name in names:
            results[name]["mean_rows_per_model_call"] = rows.get(name)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    import aiohttp
    import grpc

    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "aiohttp": aiohttp.__version__,
                     "grpcio": grpc.__version__},
        "method": "single-row requests; loop_batchN: one thread calling model(x) on N rows, figures per row; serve_P_cN: N concurrent "
                  "tritonclient asyncio clients in the benchmark process against `aotc serve` in another, per request; "
                  "server_cpu_ms_per_request: the server process's CPU time over the point / requests; best round of `rounds` by rps",
        "rounds": args.rounds,
        "seconds_per_point": args.seconds,
        "target": args.target,
        "device": args.device,
        "results": results,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
