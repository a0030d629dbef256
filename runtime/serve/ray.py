"""Serve aotc packages on Ray Serve: replicas that each load the packages and answer the v2 HTTP protocol.

    from ray import serve
    from aotc.serve.ray import app
    serve.run(app({"mlp": "mlp.pkg"}, num_replicas=2), route_prefix="/")
    # tritonclient.http.InferenceServerClient("localhost:8000") now works against Ray Serve's proxy

What it is: ``app(packages, ...)``, a Ray Serve application whose replicas are ``Replica`` objects: each
loads the packages itself, batches requests with the same ``Batcher`` as ``aotc serve``, and answers the
Open Inference Protocol's HTTP routes (health, model metadata, infer with JSON or binary tensors) behind
Ray's HTTP proxy, which spreads requests over the replicas. A Python caller can also use the deployment
handle: ``handle.infer.remote("mlp", {"x": x})``. ``ray`` is imported only when ``app`` is called.
What it is not: gRPC (Ray Serve's gRPC proxy needs its own generated servicers; use ``aotc serve`` for
gRPC), nor a place for metrics: Ray Serve exports its own per-deployment request metrics.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .protocol import ProtocolError, Request, decode_http, encode_http
from .service import ServeOptions, Service

_ROUTE = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<tail>/infer|/ready)?/?$")


class Replica:
    """One Ray Serve replica: the packages, loaded in this process, and the v2 HTTP routes over them."""

    def __init__(self, packages: Mapping[str, str], options: ServeOptions) -> None:
        self.service = Service({k: Path(v) for k, v in packages.items()}, options, logging.getLogger("aotc.serve.ray"))
        self._started = False

    def _start(self) -> None:
        if not self._started:  # the batchers need the replica's event loop, which runs only from the first call
            self.service.start()
            self._started = True

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """For deployment handles: outputs by name, or ProtocolError."""
        self._start()
        return await self.service.infer(model, "", Request("", inputs), "ray")

    async def __call__(self, request: Any) -> Any:
        """The v2 HTTP routes, from a starlette Request (what Ray Serve's proxy hands a deployment)."""
        from starlette.responses import JSONResponse, Response

        from .http_api import HEADER_LENGTH, HTTP_STATUS

        self._start()
        path, method = request.url.path, request.method
        try:
            if method == "GET" and path in ("/v2/health/live", "/v2/health/ready"):
                return Response(status_code=200)
            if method == "GET" and path.rstrip("/") == "/v2":
                return JSONResponse(self.service.server_metadata())
            m = _ROUTE.match(path)
            if m is None:
                return JSONResponse({"error": f"no route {method} {path}"}, status_code=404)
            name, version, tail = m["model"], m["version"] or "", m["tail"]
            if method == "GET" and tail == "/ready":
                return Response(status_code=200 if self.service.model_ready(name, version) else 400)
            if method == "GET" and tail is None:
                return JSONResponse(self.service.model_metadata(name, version))
            if method == "POST" and tail == "/infer":
                head = request.headers.get(HEADER_LENGTH)
                body = await request.body()
                limit = self.service.options.max_request_bytes
                if len(body) > limit:
                    raise ProtocolError(f"request body of {len(body)} bytes is over the limit of {limit} bytes", "too_large")
                req = decode_http(body, int(head) if head is not None and head.isdigit() else None)
                outs = await self.service.infer(name, version, req, "ray")
                payload, n = encode_http(name, "1", req, outs)
                if n is None:
                    return Response(payload, media_type="application/json")
                return Response(payload, headers={HEADER_LENGTH: str(n)}, media_type="application/octet-stream")
            return JSONResponse({"error": f"no route {method} {path}"}, status_code=404)
        except ProtocolError as e:
            return JSONResponse({"error": str(e)}, status_code=HTTP_STATUS[e.status])


def app(
    packages: Mapping[str, str | Path],
    num_replicas: int = 1,
    options: ServeOptions | None = None,
    ray_actor_options: dict[str, Any] | None = None,
) -> Any:
    """A Ray Serve application serving ``packages`` (name -> path, readable on every node) on ``num_replicas``."""
    from ray import serve

    opts = options or ServeOptions(device="cpu", http_port=None, grpc_port=None)
    deployment: Any = serve.deployment(
        Replica, name="aotc", num_replicas=num_replicas, ray_actor_options=ray_actor_options or {"num_cpus": 0},
    )  # fmt: skip
    return deployment.bind({k: str(Path(v).resolve()) for k, v in packages.items()}, opts)
