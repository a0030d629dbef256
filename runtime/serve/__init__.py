"""``aotc.serve``: serve packages over the Open Inference Protocol (KServe v2), the protocol of Triton Inference Server.

    aotc serve mlp.pkg cnn.pkg                 # HTTP on :8000, gRPC on :8001, Prometheus /metrics on :8000

What it is: an HTTP (aiohttp) and gRPC (grpcio) server over ``aotc.load`` with dynamic batching
(``server.py``, ``service.py``, ``batching.py``), plus the scale-out integrations ``aotc.serve.ray`` (a Ray Serve
deployment) and ``aotc.serve.triton_backend`` (a Triton Inference Server Python-backend model). Needs
``pip install 'aotc[serve]'``; importing this package alone imports none of the server libraries, and the
runtime (``aotc``) never imports it.
What it is not: a model runner: every call goes through ``aotc.Model``.
"""

from __future__ import annotations

__all__ = ["SERVE_DEPS"]

# Top-level modules `aotc serve` needs beyond the runtime (the `serve` extra); a missing one is the user's to fix.
SERVE_DEPS = frozenset({"aiohttp", "grpc", "google", "tritonclient", "prometheus_client"})
