"""System shared memory over gRPC, served by the gRPC front from its own table
(``server.fronts.client_regions``): Triton never maps a client's file. The gRPC counterpart of
``server.fronts.shm_http``.

* ``SystemSharedMemoryRegister``, ``...Unregister`` and ``...Status`` are answered here with Triton's
  own messages, from the client's part of the table.
* A ``ModelInfer`` request, or a ``ModelStreamInfer`` message, that names regions has passed the
  allow-list (``server.fronts.allow_list``, with each range's byte size; fault matrix row 61) before
  it gets here; it is
  then rewritten before Triton sees it (``raw_request``): each input in a region becomes raw contents
  read from the client's file and walked by the allow-list (``check_region_bytes``), typed contents
  of the other inputs raw contents too (Triton reads no typed contents beside raw ones), and each
  output wanted in a region comes back as raw contents. Triton's answer is
  rewritten back (``client_response``): those bytes written into the client's region, the output's
  raw contents left empty, as Triton answers a shared-memory output.
* On a stream, answers may come in any order, so a message with outputs in regions travels under an
  id of the front's own (``StreamOutputs``); the client's id is put back on its answer. How many such
  messages may wait is the stream's share (``server.fronts.deadlines.StreamWaits``): each leaves on its
  answer, and a stream whose message is late ends.
* ``--trusted-shared-memory``: a registration is checked, then forwarded, and Triton maps the file
  itself (docs/SERVING.md, "Shared memory"). CUDA shared memory needs the admin key either way.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from server.fronts.allow_list import ModelSignature, check_region_bytes
from server.fronts.client_regions import (
    Client,
    FrontRegions,
    RegionTable,
    RegionUse,
    check_copy_size,
)
from server.fronts.grpc_request import TYPED_FIELDS, parameter_value
from server.fronts.refusal import RequestRefusedError
from server.fronts.shm_http import REGION_PARAMETERS, output_too_small

RAW_TAG = bytes(
    [service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number << 3 | 2]
)


def _ours(table: RegionTable, client: Client, parameters: Any) -> RegionUse | None:
    """The range a tensor names, if the front copies it: a region the client never registered here
    is left to Triton only for the operator (the admin key: CUDA regions)."""
    if "shared_memory_region" not in parameters:
        return None
    name = parameter_value(parameters, "shared_memory_region")
    if client.admin and not table.has(client, name):
        return None
    offset = parameter_value(parameters, "shared_memory_offset") or 0
    use = RegionUse(name, offset, parameter_value(parameters, "shared_memory_byte_size"))
    for key in REGION_PARAMETERS:
        if key in parameters:
            del parameters[key]
    return use


def _raw_contents(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> bytes:
    """Typed contents as the raw bytes Triton would make of them."""
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
    """Rewrite ``request`` (already checked against ``model``: ``grpc_request.check_infer_request``)
    in place as Triton gets it: every input named in a region read from the client's file, walked by
    the allow-list (``check_region_bytes``) and put in raw contents, in input order (``limit`` bytes
    in all at most), every output wanted in a region asked for as raw contents. Returns the raw
    contents, taken out of the message (``wire`` puts them back), and the outputs to write back
    (output name -> range), their regions and ranges checked before Triton runs."""
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
    """``request`` serialized with ``raw`` as its raw contents. The raw contents are appended as their
    wire-format fields (a message's fields may come in any order; repeated ones keep theirs): upb
    takes 60-90 ms here to serialize a 16 MiB bytes field, a join about 5."""
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
    """Rewrite Triton's ``response`` in place as the client gets it: each output in ``outputs`` written
    into the client's region, its raw contents left empty. ``RequestRefusedError`` naming the output
    when a region is too small for it (checked for all before any is written)."""
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
        """The front's answer to a shared-memory call, or None to forward it (after its checks).
        ``RequestRefusedError`` for what is refused."""
        if method.startswith("CudaSharedMemory"):
            self.check_cuda(client())
            return None
        if not method.startswith("SystemSharedMemory") or request is None:
            return None
        if method == "SystemSharedMemoryRegister":
            if not self.register(client(), request.name, request.key, request.offset, request.byte_size):
                return None
            return service_pb2.SystemSharedMemoryRegisterResponse().SerializeToString()
        if self.table is None:
            return None
        if method == "SystemSharedMemoryUnregister":
            self.table.unregister(client(), request.name)
            return service_pb2.SystemSharedMemoryUnregisterResponse().SerializeToString()
        status = service_pb2.SystemSharedMemoryStatusResponse()
        for region in self.table.status(client(), request.name):
            status.regions[region.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region.status())
            )
        return status.SerializeToString()

    def to_triton(
        self, client: Client, request: service_pb2.ModelInferRequest, model: ModelSignature
    ) -> tuple[bytes | None, dict[str, RegionUse]]:
        """An inference request that names regions, checked against ``model``, as Triton gets it (None:
        forward it as sent), and the outputs to write back."""
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
    """One ``ModelStreamInfer`` stream's messages whose outputs go to the client's regions, by the id
    the front gave each: answers on a stream come in the order Triton finishes them."""

    def __init__(self, shm: GrpcSharedMemory, client: Callable[[], Client]) -> None:
        self.shm, self._client = shm, client
        self._who: Client | None = None
        self._prefix = f"front-shm-{uuid.uuid4().hex}-"
        self._numbers = itertools.count()
        self.pending: dict[str, tuple[str, dict[str, RegionUse]]] = {}

    def client(self) -> Client:
        if self._who is None:  # one stream, one connection, one client
            self._who = self._client()
        return self._who

    def to_triton(self, request: service_pb2.ModelInferRequest, model: ModelSignature) -> bytes | None:
        """The message, checked against ``model``, as Triton gets it (None: forward it as sent). The
        stream's share of waiting messages (``StreamWaits``) bounds ``pending`` too: the caller makes
        room there before this."""
        shm = self.shm
        if shm.table is None:
            return None
        raw, outputs = raw_request(shm.table, self.client(), request, model, shm.max_request_bytes)
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
                client_response(self.shm.table, self.client(), outputs, response)
            except RequestRefusedError as refusal:
                answer.error_message = str(refusal)
                answer.infer_response.CopyFrom(
                    service_pb2.ModelInferResponse(id=response.id, model_name=response.model_name)
                )
        return answer.SerializeToString()
