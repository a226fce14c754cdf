"""The fronts' cache of model configs without a server (fault matrix rows 55, 74 and 79): one fetch for
concurrent requests, Triton's refusals kept in its words, a known config kept in use while Triton does
not answer for it (stale-if-error), a model never seen or forgotten refused ``UNAVAILABLE`` then, a
config fetched again before its next check once the launcher's file says it changed. The fault matrix
runs it against the real server (tests/faults/test_config_refresh.py, test_config_reload.py).

No test here waits on a clock: ``TTL_S`` 0 makes every request after a fetch start a refresh, and what
runs in the background is waited for by yielding to the event loop until the cache shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from server.config_changes import ConfigChanges, mark_changed
from server.fronts import signature_cache
from server.fronts.allow_list import ModelSignature
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.signature_cache import ModelSignatures
from tests.unit.server.fronts.test_allow_list import ENCODER_CONFIG, LIMIT

MODEL = "text_embedding_encoder"
RELOADED_CONFIG = {**ENCODER_CONFIG, "max_batch_size": 8}  # the same model loaded again with other limits
ENCODER = ModelSignature.from_config(MODEL, ENCODER_CONFIG, LIMIT)
RELOADED = ModelSignature.from_config(MODEL, RELOADED_CONFIG, LIMIT)
OTHER = ModelSignature.from_config("other", ENCODER_CONFIG, LIMIT)
RELOADED_OTHER = ModelSignature.from_config("other", RELOADED_CONFIG, LIMIT)
HANG_GUARD_S = 30  # not a latency bound: how long a request may wait before it counts as held for good


async def _until(condition: Callable[[], bool]) -> None:
    """Let the event loop run until ``condition`` holds (the cache's background work is done)."""
    async with asyncio.timeout(HANG_GUARD_S):
        while not condition():
            await asyncio.sleep(0.001)


def _idle(cache: ModelSignatures) -> bool:
    return not cache._pending  # no fetch in flight, and the last one's answer taken in


@pytest.fixture
def refresh_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request after a fetch finds its config due for a refresh, and a failed one is asked again."""
    monkeypatch.setattr(signature_cache, "TTL_S", 0.0)
    monkeypatch.setattr(signature_cache, "RETRY_S", 0.0)
    monkeypatch.setattr(signature_cache, "FETCH_TIMEOUT_S", 0.05)


def test_configs_are_cached_and_refusals_keep_tritons_words() -> None:
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if model == "down":
            raise ConnectionError("refused")
        if model != "text_embedding_encoder":
            raise RequestRefusedError(f"Request for unknown model: '{model}' is not found", Refusal.NOT_FOUND)
        return ENCODER_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert (await cache.get("text_embedding_encoder")).inputs.keys() == {"input_ids", "mask"}
        await cache.get("text_embedding_encoder")
        with pytest.raises(RequestRefusedError, match="unknown model: 'x' is not found") as refusal:
            await cache.get("x")
        assert refusal.value.kind == Refusal.NOT_FOUND
        with pytest.raises(RequestRefusedError, match="tritonserver is not reachable") as refusal:
            await cache.get("down")
        assert refusal.value.kind == Refusal.UNAVAILABLE
        with pytest.raises(RequestRefusedError):
            await cache.get("down")  # not remembered: asked again
        cache.forget("text_embedding_encoder")
        await cache.get("text_embedding_encoder")

    asyncio.run(run())
    assert calls == ["text_embedding_encoder", "x", "down", "down", "text_embedding_encoder"]


@pytest.mark.parametrize("unanswered", ["silent", "refused"])
@pytest.mark.usefixtures("refresh_every_time")
def test_a_known_config_stays_in_use_while_triton_does_not_answer_for_it(
    unanswered: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault matrix row 74: Triton answered for the config once, then its refreshes go unanswered (a
    starved host: Triton's answer not read within ``FETCH_TIMEOUT_S``; or Triton refusing connections).
    A burst of 200 requests is checked against the known config without waiting for the refresh, one
    refresh runs for all of them, and when it fails the config stays in use: one log line, no
    ``UNAVAILABLE``. (Before: the burst waited on the refresh and was refused ``UNAVAILABLE``.)"""
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if len(calls) > 1 and unanswered == "silent":
            await asyncio.Event().wait()  # outlasts FETCH_TIMEOUT_S
        if len(calls) > 1:
            raise ConnectionError("refused")
        return ENCODER_CONFIG

    def warned() -> bool:
        return any("no config of model 'text_embedding_encoder'" in r.message for r in caplog.records)

    async def burst(cache: ModelSignatures) -> list[ModelSignature]:
        requests = asyncio.gather(*(cache.get(MODEL) for _ in range(200)))
        return await asyncio.wait_for(requests, HANG_GUARD_S)

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert await cache.get(MODEL) == ENCODER
        assert await burst(cache) == [ENCODER] * 200
        assert len(calls) == 2  # one refresh for the whole burst
        await _until(warned)
        assert await burst(cache) == [ENCODER] * 200  # and again after the refresh failed
        await _until(lambda: len(calls) == 3 and _idle(cache))  # a second refresh failed: no second line

    with caplog.at_level(logging.WARNING, logger=signature_cache.__name__):
        asyncio.run(run())
    assert sum("no config of model" in record.message for record in caplog.records) == 1, caplog.text


@pytest.mark.usefixtures("refresh_every_time")
def test_a_refresh_that_answers_replaces_the_config() -> None:
    """A model loaded again with other limits through Triton's own port: the next refresh brings them."""
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        return ENCODER_CONFIG if len(calls) == 1 else RELOADED_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert await cache.get(MODEL) == ENCODER
        assert await cache.get(MODEL) == ENCODER  # known: in use while its refresh runs
        await _until(lambda: _idle(cache))
        assert await cache.get(MODEL) == RELOADED

    asyncio.run(run())


def test_a_model_never_seen_or_forgotten_is_refused_while_triton_does_not_answer() -> None:
    """Only a config Triton answered for is kept: a model never asked for, and one forgotten (a load or
    unload passed the front), get ``UNAVAILABLE`` while Triton refuses connections, asked again each time."""
    up = [True]
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if not up[0]:
            raise ConnectionError("refused")
        return ENCODER_CONFIG

    async def refused(cache: ModelSignatures, model: str) -> None:
        with pytest.raises(RequestRefusedError, match="tritonserver is not reachable") as refusal:
            await cache.get(model)
        assert refusal.value.kind == Refusal.UNAVAILABLE

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert await cache.get(MODEL) == ENCODER
        up[0] = False
        await refused(cache, "never_seen")
        cache.forget(MODEL)
        await refused(cache, MODEL)
        await refused(cache, MODEL)

    asyncio.run(run())
    assert calls == [MODEL, "never_seen", MODEL, MODEL]


def test_a_config_past_its_stale_bound_is_refused_while_triton_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A known config is kept while refreshes fail for ``STALE_S`` at most: past it, the model counts as
    never seen."""
    monkeypatch.setattr(signature_cache, "STALE_S", 0.0)
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if len(calls) > 1:
            raise ConnectionError("refused")
        return ENCODER_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert await cache.get(MODEL) == ENCODER
        with pytest.raises(RequestRefusedError, match="tritonserver is not reachable"):
            await cache.get(MODEL)

    asyncio.run(run())


@pytest.mark.usefixtures("refresh_every_time")
def test_a_fetch_in_flight_when_the_model_is_forgotten_is_not_kept() -> None:
    """A refresh that started before a load passed the front may bring the config from before the load:
    the requests already waiting on it get it, but it is not kept over the config fetched after."""
    release: list[asyncio.Event] = []
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if len(calls) == 2:  # the refresh in flight at the load: answers late, with the old config
            release.append(asyncio.Event())
            await release[0].wait()
            return ENCODER_CONFIG
        return ENCODER_CONFIG if len(calls) == 1 else RELOADED_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT)
        assert await cache.get(MODEL) == ENCODER
        assert await cache.get(MODEL) == ENCODER  # starts the refresh that will answer late
        await _until(lambda: bool(release))
        cache.forget(MODEL)  # the load passes the front
        assert await asyncio.wait_for(cache.get(MODEL), HANG_GUARD_S) == RELOADED
        release[0].set()
        await _until(lambda: _idle(cache))
        assert await cache.get(MODEL) == RELOADED

    asyncio.run(run())


def test_a_config_whose_model_was_loaded_again_is_fetched_before_its_next_check(tmp_path: Path) -> None:
    """Fault matrix row 79: a load through Triton's own port names the model in the launcher's file; the
    model's next request waits for the config Triton serves now, well inside ``TTL_S``, while another
    model's config stays in use unfetched. (Before: checked against the config from before the load
    until the TTL passed and a refresh that request started came back.)"""
    changes = tmp_path / "config_changes"
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        return RELOADED_CONFIG if calls.count(model) > 1 else ENCODER_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT, ConfigChanges(changes))
        assert await cache.get(MODEL) == ENCODER
        assert await cache.get("other") == OTHER
        mark_changed(changes, MODEL)  # python -m server load, once Triton answered
        assert await cache.get(MODEL) == RELOADED
        assert await cache.get("other") == OTHER
        assert await cache.get(MODEL) == RELOADED

    asyncio.run(run())
    assert calls == [MODEL, "other", MODEL]


@pytest.mark.parametrize("unanswered", ["silent", "refused"])
def test_a_restarted_triton_is_asked_first_and_its_silence_keeps_the_config_held(
    unanswered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tritonserver started again (every model named): while it does not answer (silent past
    ``FETCH_TIMEOUT_S``, or refusing connections), each request is checked against the config held once
    its fetch failed (row 74's rule), and the next one asks again; the first answer replaces the config
    for every model."""
    monkeypatch.setattr(signature_cache, "FETCH_TIMEOUT_S", 0.05)
    changes = tmp_path / "config_changes"
    up = [True]
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        if not up[0] and unanswered == "silent":
            await asyncio.Event().wait()  # outlasts FETCH_TIMEOUT_S
        if not up[0]:
            raise ConnectionError("refused")
        return RELOADED_CONFIG if calls.count(model) > 1 else ENCODER_CONFIG

    async def run() -> None:
        cache = ModelSignatures(fetch, LIMIT, ConfigChanges(changes))
        assert [await cache.get(model) for model in (MODEL, "other")] == [ENCODER, OTHER]
        up[0] = False
        mark_changed(changes)  # the launcher, before it starts tritonserver again
        assert [await cache.get(model) for model in (MODEL, MODEL, "other")] == [ENCODER, ENCODER, OTHER]
        up[0] = True
        assert await cache.get(MODEL) == RELOADED
        assert await cache.get("other") == RELOADED_OTHER

    asyncio.run(run())
    assert calls == [MODEL, "other", MODEL, MODEL, "other", MODEL, "other"]


def test_a_load_through_one_front_reaches_the_other(tmp_path: Path) -> None:
    """A load passing one front (``forget``) is named in the file the other front reads."""
    changes = tmp_path / "config_changes"
    mark_changed(changes)  # the launcher's start, before the fronts: no concern of theirs
    calls: list[str] = []

    async def fetch(model: str, version: str) -> dict:
        calls.append(model)
        return RELOADED_CONFIG if len(calls) > 2 else ENCODER_CONFIG

    async def run() -> None:
        http, grpc = (ModelSignatures(fetch, LIMIT, ConfigChanges(changes)) for _ in range(2))
        assert [await http.get(MODEL), await grpc.get(MODEL)] == [ENCODER, ENCODER]
        http.forget(MODEL)  # a load passed the HTTP front
        assert [await grpc.get(MODEL), await http.get(MODEL)] == [RELOADED, RELOADED]

    asyncio.run(run())
    assert calls == [MODEL] * 4
