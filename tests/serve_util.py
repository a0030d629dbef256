"""Helpers for the serving tests (imported, not fixtures): build the example packages, run ``aotc serve`` in a
subprocess on free ports, and stop it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-c", "from aotc.cli import main; main()", "serve"]


def build_example(name: str, out: Path, cache: Path) -> Path:
    """An example package for the CPU (x86-64-v3, as tests/test_examples.py builds them: shared kernel cache)."""
    from aotc_build.build import build
    from aotc_build.options import BuildOptions, Target

    pkg = out / f"{name}.pkg"
    if not pkg.exists():
        build(ROOT / "examples" / f"{name}.py", pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), cache_dir=cache)
    return pkg


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    log: Path
    http_port: int
    grpc_port: int

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_server(packages: list[str], log: Path, *args: str, timeout: float = 60) -> Server:
    """``aotc serve PACKAGES ARGS`` on free ports; returns once it logs "listening"."""
    with log.open("wb") as f:
        proc = subprocess.Popen([*SERVE, *packages, "--http-port", "0", "--grpc-port", "0", *args], stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line)["event"] == "listening":
                doc = json.loads(line)
                return Server(proc, log, doc["http_port"], doc["grpc_port"])
        if proc.poll() is not None:
            raise RuntimeError(f"aotc serve exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"aotc serve did not start in {timeout} s:\n{log.read_text()}")
