"""``aotc build`` killed with SIGKILL at random points: the output path holds the old package or a complete
new one, never a partial file; no compiler outlives the build; the next build removes the temporary files
a killed one left.

Each build is a fork of one server process that imported torch and the builder and ran one export once,
so 20 builds cost what their capture, lowering and g++ cost. Every build starts with an empty kernel cache, so g++ runs
in each and many kills land while it runs (aotc_build.compile.run_tied is what must kill it then).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aotc.package import Package

SERVER = r"""
import json, os, sys
import aotc_build.build, aotc.cli  # torch, the builder and the CLI, imported once before forking
import torch
from aotc.__main__ import main
from aotc_build.capture import capture_module
from aotc_build.lower.driver import lower_program
# A process's first torch.export pays for lazy imports and caches: about half of a build of this MLP. Paid
# once here, every forked build starts warm, and 20 kills cost half as much. (Export and lowering only: no
# compiler and no thread pool is started before the forks.)
lower_program(capture_module(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()), (torch.randn(2, 16),)))
print("ready", flush=True)
for line in sys.stdin:
    case = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ.update(case["env"])
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.argv = ["aotc", *case["args"]]
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

MODEL = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, {out}))
example_inputs = (torch.randn(2, 16),)
"""

# The killed builds: one pointwise kernel, whose g++ takes half of the MLP's; g++ is still most of each
# build, so most kills land while it runs.
POINTWISE = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * {scale} + 1.0)

model = Model()
example_inputs = (torch.randn(2, 16),)
"""


class Server:
    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._line(300) == "ready"

    def _line(self, timeout: float) -> str | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else None

    def build(self, args: list[str], env: dict[str, str], kill_after: float | None, probe: Callable[[], object] = bool) -> tuple[int, bool]:
        """Run one build; SIGKILL it after ``kill_after`` seconds unless it ended (calling ``probe`` just
        before). Returns (exit code, killed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"args": args, "env": env}) + "\n")
        pid = int(self._line(60) or 0)
        assert pid > 0
        status = self._line(kill_after if kill_after is not None else 600)
        if status is not None:
            return int(status), False
        probe()
        os.kill(pid, signal.SIGKILL)
        return int(self._line(60) or 0), True

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def _compilers(mark: str) -> list[str]:
    """Processes (other than this test's) whose command line names ``mark``: our build folder."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if mark in cmd:
                out.append(f"{p.name}: {cmd[:200]}")
    return out


@pytest.mark.slow  # ~20 s on a quiet 2-core machine (20 builds of one pointwise kernel, g++ in each)
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_kill_9_during_build(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "new.py").write_text(POINTWISE.format(scale=2.0))
    (tmp_path / "old.py").write_text(POINTWISE.format(scale=3.0))
    tmp = tmp_path / "tmp"  # the compiler's build folders: their path marks our compilers in /proc
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    server = Server(tmp_path, env)
    out = tmp_path / "out.pkg"
    build = ["build", "--target", "cpu:x86-64-v2", "--no-selftest", "-q", "-o", str(out)]
    try:
        code, _ = server.build([*build, "old.py"], {"AOTC_CACHE_DIR": str(tmp_path / "cache-old")}, None)
        assert code == 0
        old = out.read_bytes()
        t0 = time.monotonic()
        code, _ = server.build([*build, "new.py"], {"AOTC_CACHE_DIR": str(tmp_path / "cache-full")}, None)
        full = time.monotonic() - t0
        assert code == 0
        rng = random.Random(int(os.environ.get("AOTC_KILL_SEED", "0")))
        outcomes = {"old": 0, "new": 0, "killed while g++ ran": 0}

        def probe() -> None:
            outcomes["killed while g++ ran"] += any("g++" in c or "cc1plus" in c for c in _compilers(str(tmp)))

        for k in range(20):
            out.write_bytes(old)
            when = rng.uniform(0.0, full * 1.1)
            code, killed = server.build([*build, "new.py"], {"AOTC_CACHE_DIR": str(tmp_path / f"cache{k}")}, when, probe)
            if out.read_bytes() == old:
                outcomes["old"] += 1
            else:
                with Package(out) as pkg:  # a complete package, every member as its manifest says
                    assert all(pkg.check(n) for n in pkg.manifest.members), f"kill at {when:.2f}s left a damaged {out}"
                outcomes["new"] += 1
            assert killed or code == 0
            deadline = time.monotonic() + 5
            while _compilers(str(tmp)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _compilers(str(tmp)), f"kill at {when:.2f}s (of {full:.2f}s) left: {_compilers(str(tmp))}"
        print(f"build {full:.1f} s; after 20 kills the output held: {outcomes}")
        code, _ = server.build([*build, "new.py"], {"AOTC_CACHE_DIR": str(tmp_path / "cache-full")}, None)
        assert code == 0
        assert not list(tmp_path.glob(".out.pkg.*.tmp")), "the last build left (or did not clean) temporary files"
    finally:
        server.close()


def _marked(mark: str) -> list[str]:
    """Processes whose environment holds ``AOTC_KILL_MARK=mark``: a build and everything it started."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"AOTC_KILL_MARK={mark}".encode() in (p / "environ").read_bytes().split(b"\0"):
                    cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
                    out.append(f"{p.name}: {cmd}")
            except OSError:
                continue
    return out


@pytest.mark.slow
def test_kill_9_while_triton_compiles(tmp_path: Path) -> None:
    """The Triton compile workers (a forkserver pool: not children of the build) exit when the build is
    killed, and so the forkserver; every kernel misses the (empty) cache, so the pool is running."""
    pytest.importorskip("triton")
    (tmp_path / "new.py").write_text(MODEL.format(out=8))
    mark = f"{os.getpid()}-{random.random()}"
    env = {**os.environ, "AOTC_CACHE_DIR": str(tmp_path / "cache"), "AOTC_KILL_MARK": mark}
    cmd = [sys.executable, "-c", "from aotc.__main__ import main; main()", "build", "new.py", "-o", "out.pkg",
           "--target", "cuda:sm_90", "--no-selftest", "-q"]  # fmt: skip
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 300
        while not any("forkserver" in c for c in _marked(mark)):
            assert p.poll() is None, "the build ended before its compile pool started"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 20
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(mark), _marked(mark)
    assert not (tmp_path / "out.pkg").exists()
