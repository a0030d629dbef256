"""A fork server for CLI cases: imports aotc once, then runs each case in a forked child.

Reads one JSON list of cases from stdin, each ``{"args": [...], "env": {...}, "stdin": "/dev/null"}``, and
prints one JSON list of results ``{"rc": int, "stdout": str, "stderr": str}`` (``rc`` negative: killed by
that signal, a crash; ``"timeout"``: a hang, killed). A child that crashes takes nothing else down, and
the cases cost a fork each instead of a new interpreter (tests/test_hostile.py has ~100 of them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

import aotc.cli  # noqa: F401  (numpy, click and the runtime, imported once before forking)
from aotc.__main__ import main

LIMIT_S = 30.0


def run_case(case: dict, work: str, k: int) -> dict:
    out, err = os.path.join(work, f"{k}.out"), os.path.join(work, f"{k}.err")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the case, then _exit (no atexit handlers or buffers of the parent)
        code = 0
        try:
            os.environ.update(case.get("env", {}))
            for fd, path, flags in ((0, case.get("stdin", "/dev/null"), os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT),
                                    (2, err, os.O_WRONLY | os.O_CREAT)):  # fmt: skip
                f = os.open(path, flags, 0o600)
                os.dup2(f, fd)
                os.close(f)
            sys.argv = ["aotc", *case["args"]]
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + LIMIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.002)
    rc: int | str = "timeout" if status is None else os.waitstatus_to_exitcode(status)
    with open(out, errors="replace") as o, open(err, errors="replace") as e:
        return {"rc": rc, "stdout": o.read(), "stderr": e.read()}


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="aotc-fork-") as work:
        results = [run_case(c, work, k) for k, c in enumerate(cases)]
    sys.stdout.write(json.dumps(results))
