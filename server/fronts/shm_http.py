"""System shared memory over HTTP, served by the HTTP front from its own table (``client_regions``):
the API answered in Triton's words, and an inference's regions copied in as binary data and its
outputs written back, so Triton never maps a client's file. CUDA shared memory needs the admin key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDict

from server.fronts.allow_list import ModelSignature, check_region_bytes
from server.fronts.body_checks import INLINE_BYTES
from server.fronts.client_regions import Client, FrontRegions, RegionTable, RegionUse, check_copy_size
from server.fronts.kserve_json import check_register, region_use
from server.fronts.refusal import Refusal, RequestRefusedError

SYSTEM_SHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]*))?/(register|unregister|status)")
CUDA_SHM = re.compile(r"/v2/cudasharedmemory(?:/region/[^/]*)?/(register|unregister|status)")
HEADER_LENGTH = "Inference-Header-Content-Length"
REWRITTEN_HEADERS = ("content-type", HEADER_LENGTH.lower())  # of an answer whose outputs went to regions
REGION_PARAMETERS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
JSON_SEPARATORS = (",", ":")


def _without_region(parameters: dict) -> dict:
    return {k: v for k, v in parameters.items() if k not in REGION_PARAMETERS}


def output_too_small(name: str, use: RegionUse, size: int) -> RequestRefusedError:
    """Triton's words for an output region too small for the output (a 400: it is the client's)."""
    return RequestRefusedError(
        f"shared memory size specified with the request for output '{name}' ({use.byte_size} bytes) "
        f"should be at least {size} bytes to hold the results"
    )


def binary_request(
    table: RegionTable,
    client: Client,
    body: bytes,
    header_length: str | None,
    model: ModelSignature,
    limit: int,
) -> tuple[bytes, int, dict[str, RegionUse]]:
    """A checked request as Triton gets it, regions as binary data, with its header's length and the
    outputs to write back; the header is parsed on the event loop, so bounded by ``INLINE_BYTES``."""
    split = int(header_length) if header_length is not None else len(body)
    if split > INLINE_BYTES:
        raise RequestRefusedError(
            f"the JSON header of this request is {split} bytes; a request with tensors in shared memory "
            f"takes at most {INLINE_BYTES} (the front rewrites it on its event loop): send its other "
            "tensors as binary data or in shared memory too",
            Refusal.TOO_LARGE,
        )
    document = json.loads(body[:split])
    inputs = [
        (item, table.copies(client, region_use(item.get("parameters") or {}, "")))
        for item in document["inputs"]
    ]
    check_copy_size((use for _, use in inputs if use is not None), limit)
    binary, carried = [], memoryview(body)[split:]
    for item, use in inputs:
        parameters = item.get("parameters") or {}
        if use is not None:
            data = table.read(client, use)
            check_region_bytes(model, item["name"], item["datatype"], item["shape"], data)
            item["parameters"] = {**_without_region(parameters), "binary_data_size": len(data)}
            binary.append(data)
        elif "binary_data_size" in parameters:
            binary.append(carried[: parameters["binary_data_size"]])
            carried = carried[parameters["binary_data_size"] :]
    outputs = {}
    for item in document.get("outputs") or []:
        parameters = item.get("parameters") or {}
        use = table.copies(client, region_use(parameters, ""))
        if use is not None:
            table.check(client, use)  # an unknown region or a range outside it: refused before Triton runs
            outputs[item["name"]] = use
            item["parameters"] = {**_without_region(parameters), "binary_data": True}
    header = json.dumps(document, separators=JSON_SEPARATORS).encode()
    return b"".join([header, *binary]), len(header), outputs


def client_response(
    table: RegionTable,
    client: Client,
    outputs: dict[str, RegionUse],
    payload: bytes,
    header_length: str | None,
) -> tuple[bytes, int | None]:
    """Triton's answer with each output of ``outputs`` written into its region (all checked first) and
    its header's length (None: no binary data left)."""
    split = int(header_length) if header_length is not None else len(payload)
    document = json.loads(payload[:split])
    kept, carried, writes = [], memoryview(payload)[split:], []
    for item in document.get("outputs") or []:
        parameters = item.get("parameters") or {}
        size = parameters.get("binary_data_size")
        if size is None:
            continue
        data, carried = carried[:size], carried[size:]
        use = outputs.get(item.get("name"))
        if use is None:
            kept.append(data)
            continue
        if size > use.byte_size:
            raise output_too_small(item["name"], use, size)
        writes.append((use, data))
        del parameters["binary_data_size"]
        if not parameters:
            del item["parameters"]
    for use, data in writes:
        table.write(client, use, data)
    header = json.dumps(document, separators=JSON_SEPARATORS).encode()
    return b"".join([header, *kept]), len(header) if kept else None


def _json(document: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(document).encode(), content_type="application/json")


class HttpSharedMemory(FrontRegions):
    """What the HTTP front does with shared memory (``FrontRegions``), in HTTP's terms."""

    def answer(
        self, method: str, path: str, body: bytes, client: Callable[[], Client]
    ) -> web.Response | None:
        """The front's answer to a shared-memory API call, or None to forward it."""
        if CUDA_SHM.fullmatch(path):
            self.check_cuda(client())
            return None
        match = SYSTEM_SHM.fullmatch(path)
        if match is None:
            return None
        name, action = match[1] or "", match[2]
        if (method == "GET") != (action == "status"):
            return _json({"error": "Method Not Allowed"}, 405)  # as Triton answers
        if action == "register" and not name:
            raise RequestRefusedError(
                "shared memory register request names no region: POST "
                "/v2/systemsharedmemory/region/<name>/register"
            )
        regions = self.serve(action, client, name, lambda: check_register(body))
        if regions is None:
            return None
        if action != "status":
            return web.Response(status=200, content_type="application/json")
        return _json([region.status() for region in regions])

    def to_triton(
        self, client: Client, body: bytes, headers: CIMultiDict[str], model: ModelSignature
    ) -> tuple[bytes, dict[str, RegionUse] | None]:
        """A request naming regions as Triton gets it (answer uncompressed) and outputs to write."""
        if self.table is None:
            return body, None
        body, header_length, outputs = binary_request(
            self.table, client, body, headers.pop(HEADER_LENGTH, None), model, self.max_request_bytes
        )
        headers[HEADER_LENGTH] = str(header_length)
        if outputs:
            headers["Accept-Encoding"] = "identity"
        return body, outputs

    def to_client(self, client: Client, outputs: dict[str, RegionUse], answer: web.Response) -> web.Response:
        """Triton's answer to a rewritten request, as the client gets it."""
        if answer.status != 200 or not outputs or self.table is None:
            return answer
        assert isinstance(answer.body, bytes)
        payload, length = client_response(
            self.table, client, outputs, answer.body, answer.headers.get(HEADER_LENGTH)
        )
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in REWRITTEN_HEADERS}
        if length is not None:
            headers[HEADER_LENGTH] = str(length)
        content_type = "application/octet-stream" if length is not None else "application/json"
        return web.Response(status=200, body=payload, headers=headers, content_type=content_type)
