"""The Open Inference Protocol over HTTP/REST (KServe v2, with Triton's binary tensor data extension), on aiohttp.

What it is: the v2 routes (health, server and model metadata, model config, infer) and ``/metrics``, as an
``aiohttp.web.Application`` over a ``Service``. Errors are ``{"error": message}`` with 400 (malformed
request), 404 (unknown model or version), 413 (body over the limit), 503 (shutting down) or 500.
What it is not: the server's life cycle (``server.py``) or the request checks (``service.py``).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .protocol import INTERNAL, INVALID, NOT_FOUND, TOO_LARGE, UNAVAILABLE, ProtocolError, decode_http, encode_http
from .service import Service

HTTP_STATUS = {INVALID: 400, NOT_FOUND: 404, TOO_LARGE: 413, UNAVAILABLE: 503, INTERNAL: 500}
HEADER_LENGTH = "Inference-Header-Content-Length"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc, separators=(",", ":")).encode(), status=status, content_type="application/json")


def _error(err: ProtocolError) -> web.Response:
    return _json({"error": str(err)}, HTTP_STATUS[err.status])


def make_app(service: Service) -> web.Application:
    limit = service.options.max_request_bytes
    # aiohttp refuses bodies over client_max_size itself; the handler checks first to answer in the protocol's form.
    app = web.Application(client_max_size=limit + 1)
    routes = web.RouteTableDef()

    def version(request: web.Request) -> str:
        return request.match_info.get("version", "")

    @routes.get("/v2/health/live")
    async def live(request: web.Request) -> web.Response:
        return web.Response(status=200)

    @routes.get("/v2/health/ready")
    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200 if service.ready() else 503)

    @routes.get("/v2")
    async def server_metadata(request: web.Request) -> web.Response:
        return _json(service.server_metadata())

    @routes.get("/v2/models/{model}/ready")
    @routes.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(request: web.Request) -> web.Response:
        return web.Response(status=200 if service.model_ready(request.match_info["model"], version(request)) else 400)

    @routes.get("/v2/models/{model}")
    @routes.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(request: web.Request) -> web.Response:
        try:
            return _json(service.model_metadata(request.match_info["model"], version(request)))
        except ProtocolError as e:
            return _error(e)

    @routes.get("/v2/models/{model}/config")
    @routes.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(request: web.Request) -> web.Response:
        try:
            return _json(service.model_config(request.match_info["model"], version(request)))
        except ProtocolError as e:
            return _error(e)

    @routes.post("/v2/repository/index")
    async def repository_index(request: web.Request) -> web.Response:
        state = "READY" if service.ready() else "UNAVAILABLE"
        return _json([{"name": n, "version": "1", "state": state} for n in sorted(service.entries)])

    @routes.post("/v2/models/{model}/infer")
    @routes.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(request: web.Request) -> web.Response:
        name, ver = request.match_info["model"], version(request)
        try:
            req = decode_http(await _body(request, limit), _header_length(request))
        except ProtocolError as e:
            service.rejected(name, "http", e)
            return _error(e)
        try:
            outs = await service.infer(name, ver, req, "http")
            body, head = encode_http(name, "1", req, outs)
        except ProtocolError as e:
            return _error(e)
        if head is None:
            return web.Response(body=body, content_type="application/json")
        return web.Response(body=body, headers={HEADER_LENGTH: str(head)}, content_type="application/octet-stream")

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        body, ctype = service.metrics.render()
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        return resp

    app.add_routes(routes)
    return app


async def _body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ProtocolError(f"request body of {request.content_length} bytes is over this server's limit of {limit} bytes", TOO_LARGE)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(f"request body is over this server's limit of {limit} bytes", TOO_LARGE) from None
    if len(body) > limit:
        raise ProtocolError(f"request body of {len(body)} bytes is over this server's limit of {limit} bytes", TOO_LARGE)
    if request.headers.get("Content-Encoding", "identity") not in ("identity", ""):
        raise ProtocolError(f"Content-Encoding {request.headers['Content-Encoding']!r} is not supported; send the body uncompressed")
    return body


def _header_length(request: web.Request) -> int | None:
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} {value!r} is not an integer") from None
