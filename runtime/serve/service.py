"""The server's core, independent of the wire: loaded packages by name, checks, batching, metrics, logs.

What it is: ``ServeOptions`` (the one frozen configuration) and ``Service``, which both front ends
(``http_api.py``, ``grpc_api.py``) call with decoded requests. It checks every request against its package
before it is queued (names, datatypes, shapes and dynamic ranges, through ``Model.bind``), so a malformed
request gets the protocol's error and never reaches a batch; it tracks requests in flight so that shutdown
can finish them.
What it is not: a wire format (``protocol.py``) or a batching policy (``batching.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import AotcError, InputMismatch
from ..loading import load
from ..model import Model
from .batching import Batcher, batch_symbol
from .metrics import UNKNOWN, Metrics
from .protocol import INTERNAL, INVALID, NOT_FOUND, UNAVAILABLE, WIRE, ProtocolError, Request, model_metadata, select_outputs, wire_datatype

PLATFORM = "aotc"
EXTENSIONS = ("binary_tensor_data", "model_configuration")


@dataclass(frozen=True)
class ServeOptions:
    """How ``aotc serve`` runs. A port of None turns that protocol off; 0 picks a free port."""

    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    max_batch: int = 64  # rows per model call, within each package's declared batch range
    batch_delay_ms: float = 0.0  # wait this long for more requests when a batch is not full
    max_request_bytes: int = 64 << 20
    device: str = "auto"
    threads: int | None = None  # CPU threads per model call (None: every core)
    grace_s: float = 30.0  # how long shutdown waits for requests in flight
    log_level: str = "info"
    access_log: bool = False  # one log line per request
    trusted_keys: tuple[str, ...] | None = None  # when set, every package must be signed by one of these


@dataclass
class Entry:
    """One served package."""

    name: str
    model: Model
    batcher: Batcher
    shapes_ok: set[tuple[tuple[int, ...], ...]]  # input shapes already checked by Model.bind


class Service:
    def __init__(self, packages: Mapping[str, str | Path], options: ServeOptions, log: logging.Logger) -> None:
        self.options = options
        self.log = log
        self.metrics = Metrics()
        self.entries: dict[str, Entry] = {}
        self.accepting = False
        self.inflight = 0
        for name, path in packages.items():
            model = load(path, device=options.device, num_threads=options.threads, trusted_keys=options.trusted_keys)
            observe = functools.partial(self.metrics.observe_batch, name)
            batcher = Batcher(model, options.max_batch, options.batch_delay_ms / 1000, on_batch=observe)
            self.entries[name] = Entry(name, model, batcher, set())
            sym = batch_symbol(model.manifest)
            log.info(
                "loaded", extra={"model": name, "package": str(path), "target": model.target, "signature": model.signature(),
                                 "batch": f"{sym.label} up to {batcher.max_rows}" if sym is not None and batcher.batching else "off"},
            )  # fmt: skip

    # -- life cycle --

    def start(self) -> None:
        for e in self.entries.values():
            e.batcher.start()
        self.accepting = True

    async def drain(self) -> None:
        """Refuse new requests, finish those in flight (up to ``grace_s``), then stop the model threads."""
        self.accepting = False
        deadline = time.monotonic() + self.options.grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.inflight:
            self.log.warning("grace period over", extra={"inflight": self.inflight})
        for e in self.entries.values():
            await e.batcher.close()

    def close(self) -> None:
        for e in self.entries.values():
            e.model.close()

    # -- health and metadata --

    def ready(self) -> bool:
        return self.accepting

    def entry(self, name: str, version: str = "") -> Entry:
        e = self.entries.get(name)
        if e is None:
            raise ProtocolError(f"unknown model {name!r}; this server has {', '.join(sorted(self.entries))}", NOT_FOUND)
        if version not in ("", "1"):
            raise ProtocolError(f"model {name!r} has no version {version!r}; it has version 1", NOT_FOUND)
        return e

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.entry(name, version)
        except ProtocolError:
            return False
        return self.accepting

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "aotc", "version": __version__, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return model_metadata(name, self.entry(name, version).model.manifest, PLATFORM)

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Triton's model configuration extension: shapes include the batch axis (max_batch_size 0)."""
        e = self.entry(name, version)
        meta = model_metadata(name, e.model.manifest, PLATFORM)

        def tensors(ts: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{"name": t["name"], "data_type": f"TYPE_{t['datatype']}", "dims": t["shape"]} for t in ts]

        cfg: dict[str, Any] = {
            "name": name, "platform": PLATFORM, "backend": PLATFORM, "max_batch_size": 0,
            "input": tensors(meta["inputs"]), "output": tensors(meta["outputs"]),
        }  # fmt: skip
        if e.batcher.batching:
            cfg["dynamic_batching"] = {"max_queue_delay_microseconds": int(self.options.batch_delay_ms * 1000)}
        return cfg

    # -- inference --

    def _check(self, e: Entry, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs in manifest order, after the checks ``Model.run`` would make (with protocol words)."""
        m = e.model
        for name in inputs:
            if all(s.name != name for s in m.inputs):
                raise ProtocolError(f"model {e.name!r} has no input {name!r}; it takes {m.signature()}")
        feeds = {}
        for s in m.inputs:
            arr = inputs.get(s.name)
            if arr is None:
                raise ProtocolError(f"input {s.name!r} ({m.describe(s)}) is missing; model {e.name!r} takes {m.signature()}")
            if arr.dtype.name != s.dtype:
                raise ProtocolError(f"input {s.name!r}: got datatype {wire_datatype(arr)}, expected {WIRE[s.dtype]} ({m.describe(s)})")
            feeds[s.name] = arr
        shapes = tuple(a.shape for a in feeds.values())
        if shapes not in e.shapes_ok:
            try:
                m.bind(shapes)
            except InputMismatch as err:
                raise ProtocolError(str(err)) from None
            if len(e.shapes_ok) > 1024:
                e.shapes_ok.clear()
            e.shapes_ok.add(shapes)
        return feeds

    async def infer(self, name: str, version: str, req: Request, protocol: str) -> dict[str, np.ndarray]:
        """Run one request; raises ProtocolError (counted, logged) for anything the client gets as an error."""
        start = time.perf_counter()
        label = name if name in self.entries else UNKNOWN
        self.metrics.requests.labels(label, protocol).inc()
        self.inflight += 1
        gauge = self.metrics.inflight.labels(label)
        gauge.inc()
        try:
            e = self.entry(name, version)
            if not self.accepting:
                raise ProtocolError("the server is shutting down", UNAVAILABLE)
            outs = select_outputs(req, await e.batcher.submit(self._check(e, req.inputs)))
        except ProtocolError as err:
            self._failed(label, protocol, req.id, err, start)
            raise
        except InputMismatch as err:  # not expected after _check; still the client's
            self._failed(label, protocol, req.id, ProtocolError(str(err), INVALID), start)
            raise ProtocolError(str(err), INVALID) from None
        except AotcError as err:
            perr = ProtocolError(f"{type(err).__name__}: {err}", INTERNAL)
            self._failed(label, protocol, req.id, perr, start)
            raise perr from None
        except Exception as err:  # a bug: the client still gets the protocol's error, the log gets the traceback
            self.log.exception("internal error", extra={"model": label, "protocol": protocol, "id": req.id})
            perr = ProtocolError(f"internal error: {type(err).__name__}: {err}", INTERNAL)
            self._failed(label, protocol, req.id, perr, start)
            raise perr from None
        finally:
            self.inflight -= 1
            gauge.dec()
        seconds = time.perf_counter() - start
        self.metrics.latency.labels(label, protocol).observe(seconds)
        if self.options.access_log:
            self.log.info("infer", extra={"model": name, "protocol": protocol, "id": req.id, "status": "ok", "ms": round(seconds * 1e3, 3)})
        return outs

    def rejected(self, name: str, protocol: str, err: ProtocolError) -> None:
        """Count a request that failed before ``infer`` (undecodable, over the size limit)."""
        label = name if name in self.entries else UNKNOWN
        self.metrics.requests.labels(label, protocol).inc()
        self._failed(label, protocol, "", err, None)

    def _failed(self, label: str, protocol: str, req_id: str, err: ProtocolError, start: float | None) -> None:
        self.metrics.errors.labels(label, protocol, err.status).inc()
        ms = None
        if start is not None:
            seconds = time.perf_counter() - start
            self.metrics.latency.labels(label, protocol).observe(seconds)
            ms = round(seconds * 1e3, 3)
        level = logging.WARNING if err.status == INTERNAL else logging.INFO
        if level == logging.WARNING or self.options.access_log:
            extra = {"model": label, "protocol": protocol, "id": req_id, "status": err.status, "error": str(err), "ms": ms}
            self.log.log(level, "infer failed", extra=extra)
