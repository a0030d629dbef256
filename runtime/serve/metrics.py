"""Prometheus metrics and structured (JSON lines) logs for the server.

What it is: one ``Metrics`` object per server, on its own registry (two servers in one process never share
counts): requests, errors by status and a latency histogram per model and protocol, batch sizes, requests in
flight. ``JsonFormatter`` writes each log record as one JSON object with its ``extra`` fields.
What it is not: an exporter; ``/metrics`` on the HTTP port serves ``Metrics.render()``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

UNKNOWN = "(unknown)"  # the model label of requests for models the server does not have (bounded cardinality)

_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("aotc_requests", "Inference requests received.", ["model", "protocol"], registry=r)
        self.errors = Counter(
            "aotc_request_errors", "Inference requests answered with an error.", ["model", "protocol", "status"], registry=r
        )
        self.latency = Histogram(
            "aotc_request_duration_seconds", "Inference request time, decode to encode.", ["model", "protocol"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "aotc_batch_rows", "Rows per model call (dynamic batching).", ["model"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Counter("aotc_batched_requests", "Requests run as part of a batch of several.", ["model"], registry=r)
        self.inflight = Gauge("aotc_inflight_requests", "Inference requests being served now.", ["model"], registry=r)

    def observe_batch(self, model: str, rows: int, requests: int) -> None:
        self.batch_rows.labels(model).observe(rows)
        if requests > 1:
            self.batch_requests.labels(model).inc(requests)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "event": msg, **extra}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str) -> logging.Logger:
    """The ``aotc.serve`` logger writing JSON lines to stderr (idempotent)."""
    log = logging.getLogger("aotc.serve")
    log.setLevel(level.upper())
    if not any(isinstance(h.formatter, JsonFormatter) for h in log.handlers):
        h = logging.StreamHandler()
        h.setFormatter(JsonFormatter())
        log.addHandler(h)
        log.propagate = False
    return log
