"""Build progress: each stage as it starts, kernels compiled out of total, and the quiet/verbose switch.

What it is: ``Progress`` (the no-op the library uses by default), ``RichProgress`` (a live line on a
terminal, through ``rich``), and ``hush()``, which keeps torch's warnings, log records and FX graph dumps
off the terminal unless ``--verbose`` (they are replayed if the build dies of something unexpected).
What it is not: timing. ``build.py`` measures stages; this only shows them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import IO, Any


class Progress:
    """The silent default: the builder calls these whether or not anyone shows them."""

    def stage(self, name: str, detail: str = "") -> None:
        pass

    def kernels(self, done: int, total: int) -> None:
        pass

    def close(self) -> None:
        pass


class RichProgress(Progress):
    """One live status line on ``stream`` (a terminal): the stage, and a bar while kernels compile."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self._console = Console(file=stream, stderr=False, highlight=False)
        self._bar = Bar(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self._console, transient=True,
        )  # fmt: skip
        self._bar.start()
        self._task = self._bar.add_task("starting", total=None)
        self._last = ""
        self._t0 = time.perf_counter()

    def _done(self) -> None:
        if self._last:
            self._console.print(f"[green]✓[/green] {self._last} [dim]{time.perf_counter() - self._t0:.1f} s[/dim]")

    def stage(self, name: str, detail: str = "") -> None:
        self._done()
        self._last, self._t0 = name, time.perf_counter()
        self._bar.remove_task(self._task)  # a fresh task: rich keeps an old total through update(total=None)
        self._task = self._bar.add_task(f"{name} {detail}".rstrip(), total=None)

    def kernels(self, done: int, total: int) -> None:
        self._bar.update(self._task, total=total, completed=done)

    def close(self) -> None:
        self._done()
        self._bar.stop()


@contextlib.contextmanager
def hush(verbose: bool) -> Iterator[IO[str]]:
    """Unless ``verbose``: warnings ignored, torch's loggers raised to ERROR, and file descriptor 2 sent to a
    temporary file (torch writes some messages from C++ and through handlers that hold the old stderr).
    Yields a stream on the real stderr for progress and aotc's own messages. On an exception that is not an
    ``AotcError`` the captured text is replayed, so a crash keeps its evidence."""
    from aotc.errors import AotcError

    if verbose:
        logging.getLogger("aotc").setLevel(logging.INFO)
        if not logging.getLogger().handlers:
            logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
        yield sys.stderr
        return
    sys.stderr.flush()
    saved = os.dup(2)
    real = os.fdopen(os.dup(saved), "w", buffering=1)
    sink = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally below, after the yield)
    loggers = [logging.getLogger(n) for n in ("torch", "torch._dynamo", "torch.export", "torch._export", "torch.fx", "torch._subclasses")]
    levels = [lg.level for lg in loggers]
    os.dup2(sink.fileno(), 2)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            for lg in loggers:
                lg.setLevel(logging.ERROR)
            yield real
    except AotcError:
        raise
    except BaseException:
        _restore(saved, sink, loggers, levels)
        sink.seek(0)
        real.write(sink.read())
        raise
    finally:
        _restore(saved, sink, loggers, levels)
        os.close(saved)
        real.close()
        sink.close()


def _restore(saved: int, sink: Any, loggers: list[logging.Logger], levels: list[int]) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.dup2(saved, 2)
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)
