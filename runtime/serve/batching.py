"""Dynamic batching: requests to one model queue up and run together, concatenated along the batch axis.

What it is: ``batch_symbol`` (which dynamic dimension, if any, a package can batch along) and ``Batcher``, an
asyncio queue per model drained by one worker that runs the model on a thread of its own. While the model
computes one batch, new requests queue; the next batch takes all of them that fit (the Triton server's
default policy, no added delay), or waits ``delay_s`` for more when asked to.
What it is not: a checker. Requests reach ``submit`` already checked against the package (``service.py``),
so one bad request never fails a batch.

Note: a package batches only when every input and every output has the same plain symbol as axis 0 and no
other dimension depends on it; then row i of a batched output is the output of row i alone. The CPU kernels
compute each row the same way whatever the batch size (checked bit for bit in tests/test_serve.py), so
batching never changes an answer. Requests batch together only when their other dimensions (a sequence
length, say) are equal, and never beyond the symbol's declared range.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..model import Model
from ..schema import Manifest, Symbol
from ..shapes import symbols


def batch_symbol(manifest: Manifest) -> Symbol | None:
    """The dynamic dimension that axis 0 of every input and output is, when the package can batch along it."""
    specs = (*manifest.inputs, *manifest.outputs)
    if not specs or any(not s.shape for s in specs):
        return None
    first = {s.shape[0] for s in specs}
    sym = next((y for y in manifest.symbols if first == {y.name}), None)
    if sym is None:
        return None
    if any(sym.name in symbols(d) for s in specs for d in s.shape[1:]):
        return None
    return sym


@dataclass
class _Pending:
    feeds: dict[str, np.ndarray]
    rows: int
    key: tuple[object, ...]  # requests with equal keys can share a batch
    future: asyncio.Future[dict[str, np.ndarray]]
    queued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Runs one model's requests, batched when the package allows it. ``on_batch(rows, requests)`` observes."""

    def __init__(self, model: Model, max_rows: int, delay_s: float = 0.0, on_batch: Callable[[int, int], None] | None = None) -> None:
        sym = batch_symbol(model.manifest)
        self.model = model
        self.max_rows = 1 if sym is None else max(1, min(max_rows, sym.max if sym.max is not None else max_rows))
        self.batching = sym is not None and self.max_rows > 1
        self.delay_s = delay_s
        self.on_batch = on_batch
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        # Model calls are serial per model: one thread owns it (the executor holds one arena).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"aotc-{model.manifest.model.name}")
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def close(self) -> None:
        """Stop after the queued requests ran (the caller stops new ones from arriving first)."""
        while self._queue or self._busy:
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._pool.shutdown(wait=True)

    async def submit(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = list(feeds.values())
        rows = arrays[0].shape[0] if self.batching else 1
        key = batch_key(feeds) if self.batching else (id(feeds),)
        fut: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(feeds, rows, key, fut))
        self._wake.set()
        return await fut

    def _take(self) -> list[_Pending]:
        """The oldest request and every later one with its key that fits in max_rows, in order."""
        first = self._queue.popleft()
        batch, rows, rest = [first], first.rows, deque[_Pending]()
        while self._queue:
            p = self._queue.popleft()
            if p.key == first.key and rows + p.rows <= self.max_rows:
                batch.append(p)
                rows += p.rows
            else:
                rest.append(p)
        self._queue = rest
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if self.delay_s and self.batching and sum(p.rows for p in self._queue) < self.max_rows:
                    wait = self.delay_s - (time.perf_counter() - self._queue[0].queued)
                    if wait > 0:
                        await asyncio.sleep(wait)
                batch = [p for p in self._take() if not p.future.done()]  # a client that left is dropped
                if not batch:
                    continue
                self._busy = True
                try:
                    outs = await loop.run_in_executor(self._pool, self._run, [p.feeds for p in batch])
                except Exception as e:
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(e)
                    continue
                finally:
                    self._busy = False
                if self.on_batch is not None:
                    self.on_batch(sum(p.rows for p in batch), len(batch))
                for p, out in zip(batch, outs, strict=True):
                    if not p.future.done():
                        p.future.set_result(out)

    def _run(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return run_batch(self.model, feeds)


def run_batch(model: Model, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Run requests that share a batch key as one call (one request: as it is); outputs split back by rows."""
    host = model.executor.to_host
    if len(feeds) == 1:
        return [{k: host(v) for k, v in model.run(feeds[0]).items()}]
    joined = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
    out = {k: host(v) for k, v in model.run(joined).items()}
    ends = np.cumsum([next(iter(f.values())).shape[0] for f in feeds])[:-1]
    parts = {k: np.split(v, ends) for k, v in out.items()}
    return [{k: parts[k][i] for k in out} for i in range(len(feeds))]


def batch_key(feeds: dict[str, np.ndarray]) -> tuple[object, ...]:
    """Requests with equal keys can run as one batch: the same dtypes and the same sizes past axis 0."""
    return tuple((a.dtype.str, a.shape[1:]) for a in feeds.values())
