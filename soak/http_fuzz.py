"""A seeded mutation fuzzer for the HTTP front, in the style of Triton's ``L0_http_fuzz``: valid requests
to every endpoint ``make serve`` exposes, built from each model's metadata, mutated in the request line,
the request target (``mutate_target``), the headers and the body. Each case must get an answer below 500
(``soak.raw_http``'s rule); one seed, one sequence of cases, so a finding replays."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shared_memory
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

from soak.fuzz_headers import encoded
from soak.raw_http import Request, address, exchange

VALUES: list[Any] = [
    2**40, 2**61, 2**63, 2**64, -1, -(2**63), 0, 1.5, 1e308, "x", "", "²", "\x00", "A" * 5000,
    [], {}, None, True, False, [2**62, 13], [[[[[[[[[[1]]]]]]]]]], {"a": {"b": [1, {"c": None}]}},
]  # fmt: skip
DATATYPES = ["BOOL", "UINT8", "INT8", "INT64", "UINT64", "FP16", "BF16", "FP32", "FP64", "BYTES", "FP99", ""]
CONTENT_TYPES = [
    "(" * 300, "application/x-www-form-urlencoded", "multipart/form-data; boundary=zz", "text/plain",
    "application/json; charset=utf-16", "", "a/b/c", "application/json\x00", "application/octet-stream",
]  # fmt: skip
HEADER_LENGTHS = ["²", "9" * 5000, "-1", "+5", "0", " 12", "1e3", "0x10"]
# Triton's (GET, POST), HEAD (fault matrix row 65), and others its HTTP parser knows or not (row 67)
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND", "M-SEARCH"]
# a header replaced by one of its odd values, and how the case names it
REPLACED_HEADERS = {
    1: ("Content-Type", CONTENT_TYPES, "content-type"),
    2: ("Inference-Header-Content-Length", HEADER_LENGTHS, "header length"),
}
ENCODINGS = ["gzip", "deflate", "gzip-plain", "br", "gzip, gzip", "identity", "x" * 300]
SHM_REGION = f"fuzz_{os.getpid()}"
NAME_TAILS = [
    "%00x", "\x00x", "/../../etc/passwd", "%2F..%2F", "é", "A" * 3000, "/versions/99", "/versions/-1",
]  # fmt: skip
BACKSLASH = chr(0x5C)
QUERIES = ["?", "?a=b", "?a=b&c", "?%2F", "?#", "?a=" + BACKSLASH]
ODD_CHARACTERS = ["\x00", "\t", "\x7f", "\u00e9", "\x1b", " "]
TWICE = "\x00fuzz: a key sent twice\x00"  # where a JSON object names a key again, until it is written


def _escape(character: str, upper: bool) -> str:
    return "".join(f"%{byte:02X}" if upper else f"%{byte:02x}" for byte in character.encode())


def mutate_target(path: str, rng: random.Random) -> tuple[str, str]:
    """One seeded spelling of the request target ``path`` and its name: spellings on which a front and
    Triton could read two different routes (fault matrix row 35)."""
    slashes = [i for i, c in enumerate(path) if c == "/"] or [0]  # a target mutated before may have none
    at = rng.choice(slashes)
    if not any(c.isalpha() for c in path):
        path += "v"  # something to escape or change the case of
    letter = rng.choice([i for i, c in enumerate(path) if c.isalpha()])
    choices: list[tuple[str, str]] = [
        (f"{path}#{rng.choice(['x', '', '/../../v2/health/ready', '?a=b'])}", "fragment"),
        (f"{path[:at]}/{path[at:]}", "empty segment"),
        (f"{path[:at]}/.{path[at:]}", "dot segment"),
        (f"{path[:at]}/x/..{path[at:]}", "dot-dot segment"),
        (f"{path}/", "trailing slash"),
        (f"/{path}", "leading double slash"),
        (f"{path[:at]}{_escape('/', rng.random() < 0.5)}{path[at + 1 :]}", "escaped slash"),
        (path[:at] + BACKSLASH + path[at + 1 :], "backslash"),
        (f"{path[:at]}%5C{path[at + 1 :]}", "escaped backslash"),
        (f"{path[:letter]}{_escape(path[letter], rng.random() < 0.5)}{path[letter + 1 :]}", "escaped letter"),
        (f"{path[:letter]}%25{ord(path[letter]):02X}{path[letter + 1 :]}", "double escape"),
        (f"{path}{rng.choice(['%23x', '%3Fa=b', '%2E', '%00', '%', '%g1', '%2e%2e'])}", "escaped tail"),
        (f"http://{rng.choice(['fuzz', '127.0.0.1', 'localhost:1'])}{path}", "absolute-form"),
        (path + rng.choice(QUERIES), "query"),
        (f"{path};{rng.choice(['x', 'a=b', ''])}", "parameter"),
        (f"{path[:letter]}{path[letter].swapcase()}{path[letter + 1 :]}", "case"),
        (path[:at] + rng.choice(ODD_CHARACTERS) + path[at:], "control or non-ASCII"),
        (rng.choice(["*", "fuzz:80", "v2/health/ready", path.lstrip("/")]), "not origin-form"),
    ]
    return rng.choice(choices)


@dataclass
class Case(Request):
    """A request of the fuzz and what was mutated in it."""

    mutations: list[str] = field(default_factory=list)


def seed_cases(url: str, models: list[str]) -> list[Case]:
    """Valid requests to every endpoint, built from each model's metadata on the server at ``url``."""
    with httpclient.InferenceServerClient(url) as client:  # closed here, not by whichever thread collects it
        metadata_of = {model: client.get_model_metadata(model) for model in models}
    json_type = [("Content-Type", "application/json")]
    cases = [
        Case("GET", "/v2/health/live", []), Case("GET", "/v2/health/ready", []), Case("GET", "/v2", []),
        Case("GET", "/v2/models/stats", []), Case("POST", "/v2/systemsharedmemory/status", json_type),
        Case("POST", "/v2/repository/index", json_type, b"{}"),
        Case("POST", "/v2/logging", json_type, b'{"log_verbose_level": 1}'),
        Case(
            "POST", f"/v2/systemsharedmemory/region/{SHM_REGION}/register", json_type,
            json.dumps({"key": f"/{SHM_REGION}", "byte_size": 64}).encode(),
        ),
        Case("POST", f"/v2/systemsharedmemory/region/{SHM_REGION}/unregister", json_type),
    ]  # fmt: skip
    for model, metadata in metadata_of.items():
        base = f"/v2/models/{model}"
        cases += [Case("GET", base + tail, []) for tail in ("", "/config", "/ready", "/stats")]
        inputs, binary_inputs, payloads, generate = [], [], [], {}
        for tensor in metadata["inputs"]:
            shape = [1 if d < 0 else d for d in tensor["shape"]]
            if tensor["shape"] and tensor["shape"][-1] < 0:
                shape[-1] = 4  # a variable axis: a few elements
            if tensor["datatype"] == "BYTES":  # JSON values, and the binary form's length-prefixed elements
                array = np.full(shape, b"fuzz", dtype=object)
                data, payload = [v.decode() for v in array.flatten()], serialize_byte_tensor(array).item()
            else:
                array = np.ones(shape, triton_to_np_dtype(tensor["datatype"]))
                data, payload = array.flatten().tolist(), array.tobytes()
            item = {"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"]}
            payloads.append(payload)
            inputs.append({**item, "data": data})
            binary_inputs.append({**item, "parameters": {"binary_data_size": len(payloads[-1])}})
            generate[tensor["name"]] = data
        cases.append(Case("POST", f"{base}/infer", json_type, json.dumps({"inputs": inputs}).encode()))
        head = json.dumps({"inputs": binary_inputs}).encode()
        length = ("Inference-Header-Content-Length", str(len(head)))
        binary_type = [("Content-Type", "application/octet-stream"), length]
        cases.append(Case("POST", f"{base}/infer", binary_type, head + b"".join(payloads)))
        cases.append(Case("POST", f"{base}/generate", json_type, json.dumps(generate).encode()))
    return cases


def _nodes(document: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value in ``document`` (long lists sampled by their first items)."""
    found, pending = [], [document]
    while pending:
        node = pending.pop()
        items = (
            node.items() if isinstance(node, dict) else enumerate(node[:8]) if isinstance(node, list) else ()
        )
        for key, value in items:
            found.append((node, key))
            pending.append(value)
    return found


class Mutator:
    """Seeded mutations of a case: one seed, one sequence."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def mutate(self, seed: Case) -> Case:
        case = Case(seed.method, seed.path, list(seed.headers), seed.body)
        operations = [self.line, self.target, self.header, self.json, self.bytes, self.encoding]
        for _ in range(self.rng.randint(1, 3)):
            self.rng.choice(operations)(case)
        return case

    def line(self, case: Case) -> None:
        if self.rng.random() < 0.3:
            case.method = self.rng.choice(METHODS)
            case.mutations.append(f"method {case.method}")
        else:
            parts = case.path.split("/")
            index = self.rng.randrange(1, len(parts)) if len(parts) > 1 else 0  # "*" has no "/"
            tail = self.rng.choice(NAME_TAILS)
            parts[index] += tail
            case.path = "/".join(parts) + ("?a=b" * self.rng.randint(0, 3))
            case.mutations.append(f"path +{tail[:12]!r}")

    def target(self, case: Case) -> None:
        case.path, what = mutate_target(case.path, self.rng)
        case.mutations.append(f"target {what}")

    def header(self, case: Case) -> None:
        choice = self.rng.randrange(5)
        if choice == 0 and case.headers:
            name, _ = self.rng.choice(case.headers)
            length = "length" in name.lower()
            case.headers.append(
                (name, str(self.rng.randint(0, len(case.body) + 10)) if length else "text/plain")
            )
            case.mutations.append(f"duplicate {name}")
        elif choice in REPLACED_HEADERS:
            name, values, what = REPLACED_HEADERS[choice]
            case.headers = [h for h in case.headers if h[0].lower() != name.lower()]
            case.headers.append((name, self.rng.choice(values)))
            case.mutations.append(what)
        elif choice == 3:
            case.headers.append(("Transfer-Encoding", "chunked"))
            case.mutations.append("chunked")
        else:
            case.headers.append((f"X-Fuzz-{self.rng.randrange(99)}", "v" * self.rng.choice([1, 5000])))
            case.mutations.append("extra header")

    def encoding(self, case: Case) -> None:
        encoding = self.rng.choice(ENCODINGS)
        case.body = encoded(case.body, encoding)
        case.headers.append(("Content-Encoding", encoding.removesuffix("-plain")))
        case.mutations.append(f"encoding {encoding[:12]}")

    def json(self, case: Case) -> None:
        try:
            document = json.loads(case.body)
        except ValueError:
            return self.bytes(case)
        nodes = _nodes(document)
        if not nodes:
            return None
        container, key = self.rng.choice(nodes)
        operation = self.rng.randrange(4)
        twice = ""
        if operation == 0:
            container[key] = self.rng.choice(VALUES)
            case.mutations.append(f"json {key!r}={str(container[key])[:20]}")
        elif operation == 1:
            del container[key]
            case.mutations.append(f"json del {key!r}")
        elif operation == 2 and isinstance(container, dict):
            pairs = list(container.items())  # the key's second value goes first
            container.clear()
            container[TWICE] = self.rng.choice(VALUES)
            container.update(pairs)
            twice = json.dumps(key)
            case.mutations.append(f"json duplicate {key!r}")
        else:
            item = next((n for n, k in nodes if isinstance(n, dict) and "datatype" in n), None)
            if item is not None:
                item["datatype"] = self.rng.choice(DATATYPES)
                item["shape"] = [
                    self.rng.choice([0, 1, 2, 13, 2**20, 2**40, 2**62]) for _ in range(self.rng.randint(0, 3))
                ]
                case.mutations.append(f"json {item['datatype']} {item['shape']}")
        body = json.dumps(document, separators=(",", ":"))
        case.body = (body.replace(json.dumps(TWICE), twice, 1) if twice else body).encode()
        return None

    def bytes(self, case: Case) -> None:
        body = bytearray(case.body)
        operation = self.rng.randrange(3)
        if operation == 0 and body:
            for _ in range(self.rng.randint(1, 8)):
                body[self.rng.randrange(len(body))] = self.rng.randrange(256)
        elif operation == 1 and body:
            del body[self.rng.randrange(len(body)) :]
        else:
            at = self.rng.randrange(len(body) + 1)
            body[at:at] = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 64)))
        case.body = bytes(body)
        case.mutations.append(("flip", "cut", "insert")[operation])


@dataclass
class FuzzReport:
    seed: int
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)
    target_cases: list[int] = field(default_factory=list)  # the cases whose request target was mutated

    def text(self) -> str:
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items(), key=str))
        lines = [f"http fuzz (seed {self.seed}): {self.cases} cases; answers {counts}"]
        return "\n".join(lines + [f"  FINDING {f}" for f in self.findings])


def fuzz(
    url: str, models: list[str], cases: int, seed: int, after_each: Callable[[], list[str]] | None = None
) -> FuzzReport:
    """``cases`` mutated requests to the HTTP front at ``url``; a finding is a 5xx, no answer, or what
    ``after_each()`` reports."""
    seeds = seed_cases(url, models)
    mutator = Mutator(seed)
    report = FuzzReport(seed)
    region = shared_memory.create_shared_memory_region(SHM_REGION, f"/{SHM_REGION}", 64)  # the seeds' own
    try:
        for number in range(cases):
            case = mutator.mutate(mutator.rng.choice(seeds))
            answer = exchange(address(url), case)
            report.cases += 1
            if any(m.startswith("target ") for m in case.mutations):
                report.target_cases.append(number)
            report.statuses[answer.status or "none"] += 1
            problems = [f"no answer ({answer.failure})"] if answer.failure else []
            if answer.status >= 500:
                problems.append(f"{answer.status} {answer.body[:160]!r}")
            problems += after_each() if after_each else []
            sent = f"{case.method} {case.path[:80]} [{', '.join(case.mutations)}] body {case.body[:120]!r}"
            report.findings += [f"case {number}: {sent}: {p}" for p in problems]
    finally:
        shared_memory.destroy_shared_memory_region(region)
    return report
