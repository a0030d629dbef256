"""The ``aotc serve`` command (registered on the ``aotc`` group in ``aotc.cli``).

What it is: click options into ``ServeOptions``, then ``server.serve``. The server libraries are imported
only when the command runs, so ``aotc --help`` and the runtime-only install never need them.
What it is not: anything a Python user could want; that is ``aotc.serve.server.serve``.
"""

from __future__ import annotations

import click

from ..cli_group import trust_options, trusted_keys
from ..errors import UsageError
from . import SERVE_DEPS


@click.command()
@click.argument("packages", nargs=-1, required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--http-port", type=int, default=8000, show_default=True, help="HTTP/REST port (0: any free port; -1: no HTTP).")
@click.option("--grpc-port", type=int, default=8001, show_default=True, help="gRPC port (0: any free port; -1: no gRPC).")
@click.option("--max-batch", type=click.IntRange(1), default=64, show_default=True, help="Most rows per model call when batching.")
@click.option("--batch-delay-ms", type=click.FloatRange(0), default=0.0, show_default=True, help="Wait this long for a fuller batch.")
@click.option("--max-request-mb", type=click.FloatRange(0, min_open=True), default=64.0, show_default=True, help="Largest request body.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=int, default=None, help="CPU threads per model call (default: every core).")
@click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True, help="Seconds shutdown waits for requests in flight.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.option("--access-log", is_flag=True, help="Log every request (JSON lines on stderr).")
@trust_options
def serve(
    packages: tuple[str, ...],
    host: str,
    http_port: int,
    grpc_port: int,
    max_batch: int,
    batch_delay_ms: float,
    max_request_mb: float,
    device: str,
    threads: int | None,
    grace: float,
    log_level: str,
    access_log: bool,
    trusted_key: tuple[str, ...],
    require_signature: bool,
) -> None:
    """Serve PACKAGES ([NAME=]PKG, each named by its file stem by default) over the Open Inference Protocol
    (KServe v2, as Triton Inference Server speaks it) on HTTP and gRPC. Needs pip install 'aotc[serve]'."""
    from ..cli_group import refusals

    with refusals():
        keys = trusted_keys(require_signature, trusted_key)
        try:
            from .server import parse_packages
            from .server import serve as run_server
            from .service import ServeOptions
        except ImportError as e:
            if (e.name or "").split(".")[0] not in SERVE_DEPS:
                raise
            raise UsageError(f"`aotc serve` needs the server libraries ({e}): pip install 'aotc[serve]'") from None
        if http_port < 0 and grpc_port < 0:
            raise UsageError("--http-port -1 and --grpc-port -1 leave nothing to serve")
        options = ServeOptions(
            host=host, http_port=None if http_port < 0 else http_port, grpc_port=None if grpc_port < 0 else grpc_port,
            max_batch=max_batch, batch_delay_ms=batch_delay_ms, max_request_bytes=int(max_request_mb * (1 << 20)),
            device=device, threads=threads, grace_s=grace, log_level=log_level, access_log=access_log,
            trusted_keys=None if keys is None else tuple(keys),
        )  # fmt: skip
        run_server(parse_packages(packages), options)


__all__ = ["serve"]
