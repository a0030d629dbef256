"""The Open Inference Protocol (KServe v2) data model, shared by the HTTP and gRPC front ends.

What it is: the protocol's datatypes and their numpy equivalents, tensors decoded from either wire form into
numpy arrays (JSON ``data``, Triton's binary-data extension, gRPC ``raw_input_contents`` or typed
``contents``), the metadata documents, and ``ProtocolError`` with a status each front end maps to its own
code. Imports numpy only.
What it is not: a server. ``service.py`` runs requests; ``http_api.py`` and ``grpc_api.py`` speak the wire.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import schema
from ..schema import Manifest, TensorSpec

# protocol datatype -> manifest dtype name (the types a package can have; BYTES and the wider unsigned types
# are refused: no aotc package takes them).
DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
}
WIRE = {v: k for k, v in DATATYPES.items()}

# The statuses a request can fail with; the front ends map them (HTTP code, gRPC StatusCode).
INVALID, NOT_FOUND, TOO_LARGE, UNAVAILABLE, INTERNAL = "invalid", "not_found", "too_large", "unavailable", "internal"


class ProtocolError(Exception):
    """A request the server answers with the protocol's error (``{"error": msg}`` / a gRPC status)."""

    def __init__(self, message: str, status: str = INVALID) -> None:
        super().__init__(message)
        self.status = status


def numpy_dtype(datatype: str) -> np.dtype:
    name = DATATYPES.get(datatype)
    if name is None:
        raise ProtocolError(f"datatype {datatype!r} is not supported: use one of {', '.join(DATATYPES)}")
    return schema.numpy_dtype(name)


def wire_datatype(arr: np.ndarray) -> str:
    name = "bfloat16" if arr.dtype.name == "bfloat16" else arr.dtype.name
    return WIRE[name]


@dataclass
class Request:
    """One inference request, decoded. ``outputs``: the requested output names (None: all);
    ``binary``: which outputs the HTTP client wants as binary data (gRPC always sends raw bytes)."""

    id: str
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None
    binary: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise ProtocolError(f"{where}: shape must be a list of non-negative integers, got {value!r}")
    return tuple(int(d) for d in value)


def from_bytes(name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> np.ndarray:
    """A tensor from its raw little-endian bytes (binary extension, gRPC raw contents)."""
    dt = numpy_dtype(datatype)
    want = math.prod(shape) * dt.itemsize
    if len(raw) != want:
        raise ProtocolError(
            f"input {name!r}: {len(raw)} bytes of data for shape {list(shape)} {datatype}, expected {want} bytes"
        )
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def from_list(name: str, datatype: str, shape: Sequence[int], data: Any) -> np.ndarray:
    """A tensor from JSON ``data`` (flat or nested, row-major) or from gRPC typed contents."""
    dt = numpy_dtype(datatype)
    try:
        given = np.asarray(data)
        # Values must already be of the datatype's kind: 1.5 for an INT64 input is refused, not truncated.
        if given.size and (dt.kind in "iu" and given.dtype.kind not in "iu" or dt.kind == "b" and given.dtype.kind != "b"):
            raise ValueError(f"got {given.dtype.name} values")
        arr = np.asarray(data, dtype=np.float32 if dt.name == "bfloat16" else dt)
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"input {name!r}: data is not a list of {datatype} values ({e})") from None
    if arr.size != math.prod(shape):
        raise ProtocolError(f"input {name!r}: {arr.size} values for shape {list(shape)} ({math.prod(shape)} values)")
    return arr.astype(dt, copy=False).reshape(shape)


def decode_http(body: bytes, header_length: int | None) -> Request:
    """A request body: JSON, or (binary extension) ``header_length`` bytes of JSON then the binary tensors."""
    n = len(body) if header_length is None else header_length
    if n < 0 or n > len(body):
        raise ProtocolError(f"Inference-Header-Content-Length {header_length} is outside the body ({len(body)} bytes)")
    try:
        doc = json.loads(body[:n])
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"the request header is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise ProtocolError('the request must be a JSON object with an "inputs" list')
    offset = n
    inputs: dict[str, np.ndarray] = {}
    for t in doc["inputs"]:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("datatype"), str):
            raise ProtocolError('every input needs a "name", a "datatype" and a "shape"')
        name, datatype = t["name"], t["datatype"]
        shape = _shape(t.get("shape"), f"input {name!r}")
        if name in inputs:
            raise ProtocolError(f"input {name!r} is given twice")
        params = t.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(body):
                raise ProtocolError(f"input {name!r}: binary_data_size {size!r} runs past the end of the body")
            inputs[name] = from_bytes(name, datatype, shape, memoryview(body)[offset : offset + size])
            offset += size
        elif "data" in t:
            inputs[name] = from_list(name, datatype, shape, t["data"])
        else:
            raise ProtocolError(f'input {name!r} has neither "data" nor a binary_data_size parameter')
    if offset != len(body):
        raise ProtocolError(f"the body has {len(body) - offset} bytes after the last binary input")
    params = doc.get("parameters") or {}
    req = Request(str(doc.get("id", "")), inputs, binary_default=bool(isinstance(params, dict) and params.get("binary_data_output")))
    if isinstance(doc.get("outputs"), list):
        req.outputs = []
        for o in doc["outputs"]:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError('every requested output needs a "name"')
            req.outputs.append(o["name"])
            p = o.get("parameters") or {}
            if isinstance(p, dict) and "binary_data" in p:
                req.binary[o["name"]] = bool(p["binary_data"])
    return req


def encode_http(model: str, version: str, req: Request, outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body and, when any output travels as binary data, the JSON header's length."""
    docs, blobs = [], []
    for name, arr in outputs.items():
        d: dict[str, Any] = {"name": name, "datatype": wire_datatype(arr), "shape": list(arr.shape)}
        if req.binary.get(name, req.binary_default):
            raw = np.ascontiguousarray(arr).tobytes()
            d["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            d["data"] = (arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr).ravel().tolist()
        docs.append(d)
    head: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": docs}
    if req.id:
        head["id"] = req.id
    header = json.dumps(head, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def select_outputs(req: Request, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if req.outputs is None:
        return outputs
    for name in req.outputs:
        if name not in outputs:
            raise ProtocolError(f"unknown output {name!r}; the model has {', '.join(outputs)}")
    return {name: outputs[name] for name in req.outputs}


def tensor_metadata(manifest: Manifest, spec: TensorSpec) -> dict[str, Any]:
    """A tensor's metadata: dynamic dimensions are -1, as the protocol has it."""
    return {"name": spec.name, "datatype": WIRE[spec.dtype], "shape": [d if isinstance(d, int) else -1 for d in spec.shape]}


def model_metadata(name: str, manifest: Manifest, platform: str) -> dict[str, Any]:
    return {
        "name": name,
        "versions": ["1"],
        "platform": platform,
        "inputs": [tensor_metadata(manifest, s) for s in manifest.inputs],
        "outputs": [tensor_metadata(manifest, s) for s in manifest.outputs],
    }
