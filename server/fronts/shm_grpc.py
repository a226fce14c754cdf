"""System shared memory over gRPC, the counterpart of ``shm_http``: regions copied into raw contents and
outputs written back from them; on a stream, under an id of the front's own (``StreamOutputs``).
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from server.fronts.allow_list import ModelSignature, check_region_bytes
from server.fronts.client_regions import Client, FrontRegions, RegionTable, RegionUse, check_copy_size
from server.fronts.grpc_request import TYPED_FIELDS, region_use
from server.fronts.refusal import RequestRefusedError
from server.fronts.shm_http import REGION_PARAMETERS, output_too_small

RAW_TAG = bytes(
    [service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number << 3 | 2]
)


def _ours(table: RegionTable, client: Client, parameters: Any) -> RegionUse | None:
    """The range a tensor names if the front copies it, taken out of its parameters."""
    use = table.copies(client, region_use(parameters, ""))
    for key in REGION_PARAMETERS if use else ():
        if key in parameters:
            del parameters[key]
    return use


def _raw_contents(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> bytes:
    if tensor.datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in tensor.contents.bytes_contents)
    if tensor.datatype not in TYPED_FIELDS:
        raise RequestRefusedError(f"input '{tensor.name}': {tensor.datatype} has no typed contents; send raw")
    values = getattr(tensor.contents, TYPED_FIELDS[tensor.datatype])
    return np.asarray(values, triton_to_np_dtype(tensor.datatype)).tobytes()


def raw_request(
    table: RegionTable,
    client: Client,
    request: service_pb2.ModelInferRequest,
    model: ModelSignature,
    limit: int,
) -> tuple[list[bytes], dict[str, RegionUse]]:
    """Rewrite a checked ``request`` for Triton: regions and typed contents (Triton reads none beside raw
    ones) become raw contents, returned apart for ``wire``, with the outputs to write back."""
    given = list(request.raw_input_contents)
    del request.raw_input_contents[:]
    raw: list[bytes] = []
    index = 0
    inputs = [(tensor, _ours(table, client, tensor.parameters)) for tensor in request.inputs]
    check_copy_size((use for _, use in inputs if use is not None), limit)
    if not any(use is not None for _, use in inputs):
        raw, index = given, len(given)
    else:
        for tensor, use in inputs:
            if use is not None:
                data = table.read(client, use)
                check_region_bytes(model, tensor.name, tensor.datatype, tensor.shape, data)
                raw.append(data)
            elif "shared_memory_region" in tensor.parameters:
                continue  # the operator's own region, left to Triton
            elif tensor.HasField("contents"):
                raw.append(_raw_contents(tensor))
                tensor.ClearField("contents")
            else:
                raw.append(given[index] if index < len(given) else b"")
                index += 1
    raw += given[index:]  # any excess: Triton's to refuse
    outputs = {}
    for output in request.outputs:
        use = _ours(table, client, output.parameters)
        if use is not None:
            table.check(client, use)
            outputs[output.name] = use
    return raw, outputs


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while value >= 0x80:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(encoded + bytes([value]))


def wire(request: service_pb2.ModelInferRequest, raw: list[bytes]) -> bytes:
    """``request`` with ``raw`` appended as fields: upb takes 60-90 ms on 16 MiB of bytes, a join 5."""
    parts = [request.SerializeToString()]
    for data in raw:
        parts += [RAW_TAG, _varint(len(data)), data]
    return b"".join(parts)


def client_response(
    table: RegionTable,
    client: Client,
    outputs: dict[str, RegionUse],
    response: service_pb2.ModelInferResponse,
) -> None:
    """Write each output of ``outputs`` into its region (all checked first) and empty its raw contents."""
    writes = []
    for index, tensor in enumerate(response.outputs):
        use = outputs.get(tensor.name)
        if use is None or index >= len(response.raw_output_contents):
            continue
        data = response.raw_output_contents[index]
        if len(data) > use.byte_size:
            raise output_too_small(tensor.name, use, len(data))
        writes.append((index, use, data))
    for index, use, data in writes:
        table.write(client, use, data)
        response.raw_output_contents[index] = b""


class GrpcSharedMemory(FrontRegions):
    """What the gRPC front does with shared memory (``FrontRegions``), in gRPC's terms."""

    def answer(self, method: str, request: Message | None, client: Callable[[], Client]) -> bytes | None:
        """The front's answer to a shared-memory call, or None to forward it."""
        if method.startswith("CudaSharedMemory"):
            self.check_cuda(client())
            return None
        if not method.startswith("SystemSharedMemory") or request is None:
            return None
        action = method.removeprefix("SystemSharedMemory")
        registered = (request.key, request.offset, request.byte_size) if action == "Register" else ()
        regions = self.serve(action.lower(), client, request.name, lambda: registered)
        if regions is None:
            return None
        answer = getattr(service_pb2, f"{method}Response")()
        for region in regions:
            answer.regions[region.name].CopyFrom(answer.RegionStatus(**region.status()))
        return answer.SerializeToString()

    def to_triton(
        self, client: Client, request: service_pb2.ModelInferRequest, model: ModelSignature
    ) -> tuple[bytes | None, dict[str, RegionUse]]:
        """A request that names regions as Triton gets it (None: as sent), and the outputs to write."""
        if self.table is None:  # trusted: Triton maps the files itself
            return None, {}
        raw, outputs = raw_request(self.table, client, request, model, self.max_request_bytes)
        return wire(request, raw), outputs

    def to_client(self, client: Client, outputs: dict[str, RegionUse], raw: bytes) -> bytes:
        """Triton's answer to a rewritten ``ModelInfer``, as the client gets it."""
        if not outputs or self.table is None:
            return raw
        response = service_pb2.ModelInferResponse.FromString(raw)
        client_response(self.table, client, outputs, response)
        return response.SerializeToString()


class StreamOutputs:
    """A stream's messages with outputs in regions, by an id of the front's own."""

    def __init__(self, shm: GrpcSharedMemory, client: Callable[[], Client]) -> None:
        self.shm, self._ask_client = shm, client
        self._prefix = f"front-shm-{uuid.uuid4().hex}-"
        self._numbers = itertools.count()
        self.pending: dict[str, tuple[str, dict[str, RegionUse]]] = {}

    @functools.cached_property
    def client(self) -> Client:
        return self._ask_client()  # once: one stream, one connection, one client

    def to_triton(self, request: service_pb2.ModelInferRequest, model: ModelSignature) -> bytes | None:
        """The message as Triton gets it (None: as sent); ``StreamWaits`` bounds ``pending``."""
        shm = self.shm
        if shm.table is None:
            return None
        raw, outputs = raw_request(shm.table, self.client, request, model, shm.max_request_bytes)
        if outputs:
            token = f"{self._prefix}{next(self._numbers)}"
            self.pending[token] = (request.id, outputs)
            request.id = token
        return wire(request, raw)

    def to_client(self, raw: bytes) -> bytes:
        """An answer of the stream as the client gets it: outputs written, the client's id back."""
        if not self.pending:
            return raw
        answer = service_pb2.ModelStreamInferResponse.FromString(raw)
        response = answer.infer_response
        entry = self.pending.get(response.id)
        if entry is None:
            return raw
        final = response.parameters.get("triton_final_response")
        if final is None or final.bool_param:
            del self.pending[response.id]
        response.id, outputs = entry
        if not answer.error_message:
            try:
                client_response(self.shm.table, self.client, outputs, response)
            except RequestRefusedError as refusal:
                answer.error_message = str(refusal)
                answer.infer_response.CopyFrom(
                    service_pb2.ModelInferResponse(id=response.id, model_name=response.model_name)
                )
        return answer.SerializeToString()
