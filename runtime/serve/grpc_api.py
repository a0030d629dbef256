"""The Open Inference Protocol over gRPC (KServe v2 ``inference.GRPCInferenceService``), on grpcio's asyncio server.

What it is: a servicer for the health, metadata, config, repository-index and infer calls over a ``Service``.
The messages are the protocol's own, generated from its .proto and shipped in ``tritonclient.grpc``
(``service_pb2``, ``service_pb2_grpc``): the server and every v2 client read the same definition. Inputs come
as ``raw_input_contents`` (what tritonclient sends) or typed ``contents``; outputs go as
``raw_output_contents``. Errors are gRPC statuses: INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, INTERNAL; a
message over the size limit gets RESOURCE_EXHAUSTED from grpcio itself.
What it is not: the server's life cycle (``server.py``). The streaming, statistics, shared-memory and
repository load/unload calls answer UNIMPLEMENTED (the generated base class).
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from .protocol import INTERNAL, INVALID, NOT_FOUND, TOO_LARGE, UNAVAILABLE, ProtocolError, Request, from_bytes, from_list, wire_datatype
from .service import Service

GRPC_STATUS = {
    INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    INTERNAL: grpc.StatusCode.INTERNAL,
}
# The typed ``contents`` field of each datatype (FP16 and BF16 travel only as raw bytes).
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


def decode(msg: Any) -> Request:
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise ProtocolError(f"{len(raw)} raw_input_contents for {len(msg.inputs)} inputs: send raw contents for every input or for none")
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(msg.inputs):
        shape = tuple(int(d) for d in t.shape)
        if any(d < 0 for d in shape):
            raise ProtocolError(f"input {t.name!r}: shape {list(shape)} has a negative dimension")
        if t.name in inputs:
            raise ProtocolError(f"input {t.name!r} is given twice")
        if raw:
            inputs[t.name] = from_bytes(t.name, t.datatype, shape, raw[i])
        else:
            field = CONTENTS.get(t.datatype)
            if field is None:
                raise ProtocolError(f"input {t.name!r}: datatype {t.datatype} needs raw_input_contents")
            inputs[t.name] = from_list(t.name, t.datatype, shape, list(getattr(t.contents, field)))
    outputs = [o.name for o in msg.outputs] or None
    return Request(msg.id, inputs, outputs)


def encode(name: str, req: Request, outs: dict[str, np.ndarray]) -> Any:
    resp = service_pb2.ModelInferResponse(model_name=name, model_version="1", id=req.id)
    for out_name, arr in outs.items():
        resp.outputs.add(name=out_name, datatype=wire_datatype(arr), shape=list(arr.shape))
        resp.raw_output_contents.append(np.ascontiguousarray(arr).tobytes())
    return resp


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: Service) -> None:
        self.service = service

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.service.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(**self.service.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            meta = self.service.model_metadata(request.name, request.version)
        except ProtocolError as e:
            await context.abort(GRPC_STATUS[e.status], str(e))
        return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            cfg = self.service.model_config(request.name, request.version)
        except ProtocolError as e:
            await context.abort(GRPC_STATUS[e.status], str(e))
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(cfg, model_config_pb2.ModelConfig()))

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        state = "READY" if self.service.ready() else "UNAVAILABLE"
        models = [service_pb2.RepositoryIndexResponse.ModelIndex(name=n, version="1", state=state) for n in sorted(self.service.entries)]
        return service_pb2.RepositoryIndexResponse(models=models)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        name = request.model_name
        try:
            req = decode(request)
        except ProtocolError as e:
            self.service.rejected(name, "grpc", e)
            await context.abort(GRPC_STATUS[e.status], str(e))
        try:
            outs = await self.service.infer(name, request.model_version, req, "grpc")
        except ProtocolError as e:
            await context.abort(GRPC_STATUS[e.status], str(e))
        return encode(name, req, outs)


def make_server(service: Service) -> Any:
    limit = service.options.max_request_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(service), server)
    return server
