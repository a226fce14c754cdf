"""The invariant fuzz (fault matrix row 62): hypothesis draws requests over every served model's request
space (``soak.request_space``) and sends each through both fronts; after every request three invariants
must hold:

(a) **answered**: within the model's deadline plus ``SLACK_S``, 2xx or 4xx, or 429 / 504 by policy;
never a hang, a reset or a 5xx (``soak.fuzz_wire``); on a stream, the fuzzed message and a valid one
after it; an output in a region that also asks for binary data or a classification refused (row 76);

(b) **isolated**: no client's canary (``soak.fuzz_regions``; two uids when run as root) in another
client's answer, region or listing, and no region byte changed but where an answered request named an
output;

(c) **kept**: tritonserver's PID, the fronts' PIDs and the stubs unchanged, and tritonserver's RSS at
the end within ``RSS_BOUND_MIB`` of the start."""

from __future__ import annotations

import ast
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import tritonclient.http as httpclient
from hypothesis import HealthCheck, Verbosity, given, reproduce_failure, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import DidNotReproduce

from server.admin import headers as admin_headers
from server.fronts.process import MAX_REQUEST_BYTES
from server.launcher import TritonServer
from server.proc_stat import running
from server.stubs import server_stubs
from soak import raw_grpc
from soak.fuzz_headers import (
    WIRE_FAULTS,
    compressed_accepted,
    grpc_compression,
    headers_held,
    headers_reached,
    readable,
    wire_held,
)
from soak.fuzz_regions import Regions, shm_call
from soak.fuzz_wire import (
    SLACK_S,
    Answer,
    Carried,
    Client,
    Placed,
    carried_inputs,
    control_case,
    grpc_answer,
    grpc_request,
    http_answer,
    http_body,
)
from soak.other_uid import SERVICE, OtherUser
from soak.request_space import Case, ModelSpace, OutputCase, cases

log = logging.getLogger(__name__)
# Invariant (c)'s bound (docs/SERVING.md, "The invariant fuzz"): a fresh server grows +70 MiB over 6,000
# cases, levelling off as its allocator settles; row 53's leak in a third of the cases passes it in ~11,000.
RSS_BOUND_MIB = 96.0


def served_spaces(server: TritonServer) -> dict[str, ModelSpace]:
    """Every model the server has READY, read from the config it serves."""
    with httpclient.InferenceServerClient(server.triton_http_url) as own:
        index = own.get_model_repository_index(headers=admin_headers(server.admin_key))
        ready = dict.fromkeys(entry["name"] for entry in index if entry.get("state") == "READY")
        deadline_s = server.options.front_shares.deadline_s
        return {
            name: ModelSpace.from_config(name, own.get_model_config(name), MAX_REQUEST_BYTES, deadline_s)
            for name in ready
        }


def rss_mib(pid: int | None) -> float:
    """A process's resident memory in MiB (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except OSError:
        return 0.0


@dataclass
class InvariantReport:
    """What the fuzz sent and what each invariant saw; ``text()`` is what ``make soak`` prints."""

    models: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    examples: int = 0
    verdicts: Counter = field(default_factory=Counter)  # (protocol, verdict) of each case's request
    slowest_s: float = 0.0
    slowest: str = ""
    answered: list[str] = field(default_factory=list)  # violations of (a)
    regions_checked: int = 0
    other_uid: bool = False
    isolated: list[str] = field(default_factory=list)  # violations of (b)
    server_pid: int | None = None
    front_pids: set[int] = field(default_factory=set)
    stubs: int = 0
    kept: list[str] = field(default_factory=list)  # violations of (c)
    rss_start_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_end_mib: float = 0.0
    failing_cases: list[str] = field(default_factory=list)
    covered: Counter = field(default_factory=Counter)  # what the cases reached: "ok <model>", ...
    first_failure: tuple[int, float] | None = None  # (the case's number, seconds into the run)

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_end_mib - self.rss_start_mib

    @property
    def passed(self) -> bool:
        within = self.rss_growth_mib <= RSS_BOUND_MIB
        return self.examples > 0 and not (self.answered or self.isolated or self.kept) and within

    def text(self) -> str:
        by = ", ".join(f"{p} {v} {n}" for (p, v), n in sorted(self.verdicts.items()))
        rss = (
            f"RSS {self.rss_start_mib:.0f} MiB at start, {self.rss_peak_mib:.0f} peak, "
            f"{self.rss_end_mib:.0f} at the end (growth {self.rss_growth_mib:+.0f}, bound "
            f"{RSS_BOUND_MIB:.0f})"
        )
        first = [f"    {line}" for line in (*self.answered[:3], *self.isolated[:3], *self.kept[:3])]
        if self.first_failure:
            first.append(f"  first violation: case {self.first_failure[0]}, {self.first_failure[1]:.0f} s in")
        return "\n".join(
            [
                f"invariant fuzz: {'PASSED' if self.passed else 'FAILED'}; {self.examples} cases over "
                f"{len(self.models)} models ({', '.join(self.models)}), seeds {self.seeds}",
                f"  (a) answered: {by or 'nothing sent'}; slowest {self.slowest_s:.2f} s ({self.slowest}); "
                f"violations {len(self.answered)}",
                f"  (b) isolated: {self.regions_checked} region checks, "
                f"{'two uids' if self.other_uid else 'one uid (not root: no other user)'}; violations "
                f"{len(self.isolated)}",
                f"  (c) kept: tritonserver {self.server_pid}, fronts {sorted(self.front_pids)}, "
                f"{self.stubs} stubs; {rss}; violations {len(self.kept)}",
                f"  reached: {', '.join(f'{what} {n}' for what, n in sorted(self.covered.items()))}",
                *first,
                *(f"    failing case: {case}" for case in self.failing_cases[:3]),
            ]
        )


class InvariantFuzz:
    """``with InvariantFuzz(server) as fuzz: fuzz.check(case)``; nothing is sent after ``stop_at``."""

    def __init__(self, server: TritonServer) -> None:
        self.server = server
        self.report = InvariantReport()
        self.stop_at = float("inf")
        self.fatal = ""
        self._registrations = 0

    def __enter__(self) -> InvariantFuzz:
        server = self.server
        self.spaces = served_spaces(server)
        self.report.models = sorted(self.spaces)
        self.client = Client(server.http_url, server.grpc_url)
        self.other = OtherUser(server.http_url, server.grpc_url) if OtherUser.available() else None
        self.report.other_uid = self.other is not None
        stubs = [stub for stub in server_stubs(server.pid or 0) if stub.alive]
        stub_region = stubs[0].shm_region if stubs else "no-stub-region"  # a key no client may register
        self.regions = Regions(self.client, self.other, f"fz{os.getpid()}", stub_region)
        self.regions.setup()
        self._judge(self.regions.setup_answers, 30.0, "setup")
        report = self.report
        report.server_pid, report.front_pids = server.pid, {front.pid for front in server.running_fronts}
        self.stub_pids = {stub.pid for stub in stubs}
        report.stubs = len(self.stub_pids)
        report.rss_start_mib = report.rss_peak_mib = report.rss_end_mib = rss_mib(report.server_pid)
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.report.rss_end_mib = rss_mib(self.server.pid)
        self.regions.close()
        if self.other is not None:
            self.other.close()
        self.client.close()

    def _judge(self, answers: Sequence[Answer], deadline_s: float, what: str) -> list[str]:
        problems = []
        for answer in answers:
            if answer.verdict == "broken":
                problems.append(f"(a) {what}: {answer.what} answered {answer.status}: {answer.message}")
            elif answer.elapsed_s > deadline_s + SLACK_S:
                problems.append(
                    f"(a) {what}: {answer.what} took {answer.elapsed_s:.1f} s, past {deadline_s:g} s"
                )
            if answer.elapsed_s > self.report.slowest_s:
                self.report.slowest_s = answer.elapsed_s
                self.report.slowest = f"{what} {answer.what} {answer.status}"
        self.report.answered += problems
        return problems

    def _kept(self) -> list[str]:
        """Invariant (c), but for the RSS bound (``InvariantReport.passed``)."""
        report, problems = self.report, []
        pid = self.server.pid
        alive = running(pid)
        if pid != report.server_pid or not alive:
            problems.append(f"(c) tritonserver {report.server_pid} is gone (now {pid}, alive {alive})")
        fronts = {front.pid for front in self.server.running_fronts}
        if fronts != report.front_pids:
            problems.append(f"(c) the fronts {sorted(report.front_pids)} are now {sorted(fronts)}")
        gone = [stub for stub in self.stub_pids if not running(stub, parent=pid)]
        # the full scan of /proc only when needed
        stubs = {s.pid for s in server_stubs(pid or 0) if s.alive} if gone else self.stub_pids
        if stubs != self.stub_pids:
            problems.append(
                f"(c) stubs died {sorted(self.stub_pids - stubs)}, new {sorted(stubs - self.stub_pids)}"
            )
        report.rss_peak_mib = max(report.rss_peak_mib, rss_mib(pid))
        report.kept += problems
        if problems:
            self.fatal = problems[0]
        return problems

    def check(self, case: Case) -> None:
        """Send ``case``; ``AssertionError`` lists what broke, the same line for every case once the server
        broke (hypothesis takes a moving failure for a flaky one)."""
        if time.monotonic() >= self.stop_at and not self.fatal:
            return
        problems = [f"the server broke earlier: {self.fatal}"] if self.fatal else self._held(case)
        if problems:
            if not self.report.failing_cases:
                self.report.first_failure = (self.report.examples, time.monotonic() - self._started)
            self.report.failing_cases.append(repr(case))
            raise AssertionError("\n".join(problems))

    def _held(self, case: Case) -> list[str]:
        space = self.spaces.get(case.model) or self.spaces.get(case.model.rstrip("_"))
        deadline_s = space.deadline_s if space is not None else self.server.options.front_shares.deadline_s
        answers, problems = self._send(case, space, deadline_s)
        problems += self._judge(answers, deadline_s, f"{case.protocol} {case.model}")
        theirs = self._other_uid(case, space)
        self.report.covered.update(f"{answer.what} {answer.verdict}" for answer in theirs)
        problems += self._judge(theirs, deadline_s, "other uid")
        isolated = self.regions.verify([*(("a", a) for a in answers), *(("b", b) for b in theirs)])
        mine = [self.regions.name(kind).encode() for kind in ("a0", "a1", "fresh")]
        isolated += [
            f"(b) {answer.what} lists {name.decode()}, a region of another client"
            for answer in theirs
            if answer.what == "other uid status"
            for name in mine
            if name in answer.payload
        ]
        self.report.isolated += isolated
        self.report.regions_checked += 1
        if case.registration is not None:
            front = "http" if case.protocol == "http" else "grpc"
            problems += self._judge(self.regions.end_fresh(front), 30.0, "unregister")
        self.report.examples += 1
        return problems + isolated + self._kept()

    def _send(
        self, case: Case, space: ModelSpace | None, deadline_s: float
    ) -> tuple[list[Answer], list[str]]:
        """The case's registration (if any) and request; an answered request's output ranges may change."""
        data = carried_inputs(case.inputs, space, case.seed)
        answers = []
        front = "http" if case.protocol == "http" else "grpc"
        covered = self.report.covered
        if case.registration is not None:
            self._registrations += 1
            answers.append(self.regions.register_fresh(front, case.registration, self._registrations))
            covered[f"registration {case.registration.key} {answers[-1].verdict}"] += 1
        placed_inputs = [
            self.regions.place(t.shm, len(d.raw), d.raw) if t.shm is not None else None
            for t, d in zip(case.inputs, data, strict=True)
        ]
        placed_outputs = [
            self.regions.place(o.shm, o.shm.size or 0) if o.shm is not None else None
            for o in case.outputs or ()
        ]
        answer, problems = self._request(case, space, data, placed_inputs, placed_outputs, deadline_s)
        verdict = answer.verdict
        asking_more = [o.name for o in case.outputs or () if o.asks_more_than_its_region]
        if asking_more:  # row 76: refused, and (not allowed below) nothing written into the region
            if "can't set both" in answer.message or b"can't set both" in answer.payload:
                covered[f"refused {front} shared-memory output asking for more, named"] += 1
            if verdict == "ok":
                problems.append(
                    f"(a) {case.protocol} {case.model}: outputs {asking_more} in a region that also ask for "
                    "binary data or a classification were answered, not refused"
                )
        self.report.answered += problems
        answers.append(answer)
        self.report.verdicts[(case.protocol, verdict)] += 1
        if verdict == "ok":
            covered[f"ok {case.model}"] += 1
            if any(p is not None for p in placed_inputs):  # counted only when reached: no "… 0" line
                covered[f"ok {front} shared-memory input"] += 1
            for output, placed in zip(case.outputs or (), placed_outputs, strict=True):
                if output.shm is not None and placed is not None and not output.asks_more_than_its_region:
                    self.regions.allow_output(output.shm, placed.size)
                    covered[f"ok {front} shared-memory output"] += 1
        return answers, problems

    def _request(
        self,
        case: Case,
        space: ModelSpace | None,
        data: Sequence[Carried],
        inputs: Sequence[Placed | None],
        outputs: Sequence[Placed | None],
        deadline_s: float,
    ) -> tuple[Answer, list[str]]:
        """The answer, its verdict the fuzzed request's own, and what broke (a) beyond the answer."""
        timeout, headers, covered = deadline_s + SLACK_S, case.headers, self.report.covered
        if case.protocol == "http":
            reply = self.client.http(http_body(case, data, inputs, outputs), timeout)
            answer = http_answer("infer", reply)
            shm_output = any(placed is not None for placed in outputs)
            covered.update(headers_reached(headers, reply, answer.verdict, shm_output))
            held = headers_held(headers, reply, answer.verdict)
            return answer, [f"(a) http {case.model}: {problem}" for problem in held]
        request = grpc_request(case, data, inputs, outputs)
        if case.protocol == "grpc" and headers is not None and headers.wire:  # written frame by frame
            metadata, wire_data = WIRE_FAULTS[headers.wire](request.SerializeToString())
            block = raw_grpc.call_headers(SERVICE + "ModelInfer", metadata, timeout)
            reply = raw_grpc.exchange(self.client.grpc_address, block, wire_data, timeout)
            if reply.failure:
                answer = Answer("infer", "broken", reply.failure, "", reply.elapsed_s)
            else:
                answer = grpc_answer("infer", reply.code, reply.message, reply.payload, reply.elapsed_s)
            covered[f"{answer.verdict} grpc wire {headers.wire}"] += 1
            return answer, [f"(a) grpc {case.model}: {p}" for p in wire_held(headers, answer.verdict)]
        compression, problems = grpc_compression(headers), []
        if case.protocol == "grpc":
            called = self.client.grpc("ModelInfer", request.SerializeToString(), timeout, compression)
            answer = grpc_answer("infer", *called)
            reached = answer.verdict
        else:
            messages = [request]
            if space is not None:  # the model's smallest valid request after the fuzzed one
                tensors = control_case(space)
                control = Case(space.name, "stream", tensors, None, 0)
                control_data = carried_inputs(tensors, space, 0)
                messages.append(grpc_request(control, control_data, [None] * len(tensors), [], "control"))
            answer, answered = self.client.stream(messages, timeout, compression)
            reached = answer.verdict if answered.get("fuzz") else "refused"
            if answer.verdict == "ok" and space is not None and not answered.get("control"):
                problems.append(f"(a) stream {case.model}: the valid message after the fuzzed one failed")
            if answer.verdict == "ok" and not answered.get("fuzz"):
                answer = replace(answer, verdict="refused")
        if headers is not None and headers.compression:
            covered[f"{reached} {case.protocol} {headers.compression} message"] += 1
        return answer, problems

    def _other_uid(self, case: Case, space: ModelSpace | None) -> list[Answer]:
        """The other user lists its regions, or sends the model's smallest request through its own region
        under the case's HTTP headers."""
        other = self.other
        if other is None or not case.other_uid or space is None:
            return []
        if case.other_uid == "status":
            return [shm_call(other, protocol, "other uid status", "Status") for protocol in ("http", "grpc")]
        tensors = control_case(space)
        if not tensors:
            return []
        data = carried_inputs(tensors, space, case.seed + 99)
        theirs, name = self.regions.files["b_theirs"], self.regions.name("theirs")
        theirs.write(0, data[0].raw)  # as root: the fuzz writes B's input for it
        used = len(data[0].raw)
        slot = (len(theirs.expected) - used) // max(len(space.outputs), 1)
        outputs = [Placed(name, used + i * slot, slot) for i in range(len(space.outputs))]
        wanted = tuple(OutputCase(output.name) for output in space.outputs)
        inputs = [Placed(name, 0, used), *([None] * (len(tensors) - 1))]
        headers = readable(case.headers) if case.protocol == "http" else None
        their_request = Case(space.name, "http", tensors, wanted, 0, headers=headers)
        reply = other.http(http_body(their_request, data, inputs, outputs), space.deadline_s + SLACK_S)
        answer = http_answer("other uid infer", reply)
        held = headers_held(headers, reply, answer.verdict)
        self.report.answered += [f"(a) other uid infer: {problem}" for problem in held]
        if answer.verdict == "ok":
            theirs.allowed += [(output.offset, output.offset + output.size) for output in outputs]
            if compressed_accepted(headers):
                self.report.covered["other uid infer ok, compressed answer accepted"] += 1
        return [answer]


def run_examples(fuzz: InvariantFuzz, examples: int, seed: int, replay: str = "") -> None:
    """``examples`` cases from ``seed``, or the one failure a printed ``@reproduce_failure`` blob names
    (``replay``: ``'<version> <blob>'``)."""
    fuzz.report.seeds.append(seed)

    @settings(
        max_examples=examples, deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck), verbosity=Verbosity.normal,
    )  # fmt: skip
    @hypothesis_seed(seed)
    @given(cases(sorted(fuzz.spaces.values(), key=lambda s: s.name)))
    def invariants_hold(case: Case) -> None:
        fuzz.check(case)

    if not replay:
        invariants_hold()
        return
    version, blob = replay.split(maxsplit=1)
    blob_bytes = ast.literal_eval(blob) if blob.startswith("b'") else blob.encode()
    try:
        reproduce_failure(version, blob_bytes)(invariants_hold)()
    except DidNotReproduce:
        log.info("the replayed case holds the invariants now")


def run_for(
    server: TritonServer, seconds: float, first_seed: int, examples_per_seed: int = 200
) -> InvariantReport:
    """``make soak``'s phase: seed after seed for ``seconds``, until the server broke."""
    with InvariantFuzz(server) as fuzz:
        fuzz.stop_at = time.monotonic() + seconds
        seed = first_seed
        while time.monotonic() < fuzz.stop_at and not fuzz.fatal:
            try:
                run_examples(fuzz, examples_per_seed, seed)
            except Exception as failure:  # accounted in the report, case by case; log hypothesis's summary
                log.error("invariant fuzz, seed %d: %s", seed, failure)
            seed += 1
    return fuzz.report
