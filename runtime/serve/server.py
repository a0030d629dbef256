"""``aotc serve``'s life cycle: load the packages, listen on HTTP and gRPC, stop gracefully.

What it is: ``serve(packages, options)``, which runs both front ends on one asyncio loop (model calls run on
one thread per model, outside the loop) until SIGTERM or SIGINT, then: readiness turns false, the listeners
close, the requests in flight finish (up to ``grace_s``), the models unload. ``parse_packages`` turns the
command line's ``PKG`` / ``NAME=PKG`` arguments into names.
What it is not: the protocol (``http_api.py``, ``grpc_api.py``) or the request logic (``service.py``).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .metrics import setup_logging
from .service import ServeOptions, Service


def parse_packages(specs: Sequence[str]) -> dict[str, Path]:
    """``model.pkg`` serves as ``model``; ``name=model.pkg`` as ``name``. Names must be unique."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).stem, spec
        if not name or not path or "/" in name:
            raise UsageError(f"{spec!r}: use PKG or NAME=PKG (a name without '/')")
        if name in out:
            raise UsageError(f"two packages are named {name!r}: give one another name with NAME=PKG")
        out[name] = Path(path)
    if not out:
        raise UsageError("no package to serve: aotc serve PKG [PKG...]")
    return out


def _listen(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port))
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port} ({e}): pick another port") from None
    sock.setblocking(False)
    return sock


async def _serve(packages: dict[str, Path], options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    log = setup_logging(options.log_level)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = Service(packages, options, log)
    runner = grpc_server = None
    ports: dict[str, Any] = {}
    try:
        service.start()
        if options.http_port is not None:
            from aiohttp import web

            from .http_api import make_app

            sock = _listen(options.host, options.http_port)
            ports["http_port"] = sock.getsockname()[1]
            runner = web.AppRunner(make_app(service), access_log=None, shutdown_timeout=options.grace_s)
            await runner.setup()
            await web.SockSite(runner, sock).start()
        if options.grpc_port is not None:
            from .grpc_api import make_server

            grpc_server = make_server(service)
            port = grpc_server.add_insecure_port(f"{options.host}:{options.grpc_port}")
            if port == 0:
                raise UsageError(f"cannot listen for gRPC on {options.host}:{options.grpc_port}: pick another port")
            ports["grpc_port"] = port
            await grpc_server.start()
        log.info("listening", extra={"host": options.host, **ports, "models": sorted(service.entries)})
        if on_ready is not None:
            on_ready(ports)
        await stop.wait()
        log.info("shutting down", extra={"inflight": service.inflight, "grace_s": options.grace_s})
    finally:
        # Not ready first (load balancers stop sending), then finish what is in flight, then close.
        service.accepting = False
        stops = []
        if grpc_server is not None:
            stops.append(grpc_server.stop(options.grace_s))
        drain = asyncio.ensure_future(service.drain())
        if runner is not None:
            stops.append(runner.cleanup())
        await asyncio.gather(*stops, drain)
        service.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("stopped")


def serve(packages: dict[str, Path], options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT. ``on_ready(ports)`` is called once both listeners accept."""
    asyncio.run(_serve(packages, options, on_ready))
