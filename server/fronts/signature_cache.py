"""The configs the fronts check requests against, as Triton serves them (``ModelSignatures``), one
fetch for a model's concurrent requests: a known config stays in use while Triton is slow or silent
(fault matrix row 74) and is trusted until the served configs change (row 79: ``forget``, or the
launcher's ``server.config_changes`` file); nothing is forwarded unchecked.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from server.config_changes import ConfigChanges
from server.fronts.allow_list import ModelSignature
from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
# fetch(model, version): the config, RequestRefusedError with Triton's answer, or any other error
Fetch = Callable[[str, str], Awaitable[Mapping[str, Any]]]
Key = tuple[str, str]  # (model, version)
Found = ModelSignature | RequestRefusedError
TTL_S = 5.0  # a config older than this is fetched again, in the background, when next asked for
RETRY_S = 1.0  # a refresh that failed is tried again this long after, at the next request
# How long a config stays in use while its refreshes fail: a model loaded with other dims through
# Triton's own port is checked against its old config at most this long when Triton cannot say so.
STALE_S = 300.0
UNKNOWN_TTL_S = 1.0  # how long Triton's "no such model" is kept
FETCH_TIMEOUT_S = 5.0  # how long Triton may take to answer for a config
MAX_ENTRIES = 1024  # requests naming many unknown models must not grow the cache without bound


@dataclass(slots=True)
class _Entry:
    found: Found
    refresh_at: float  # time.monotonic() after which a request starts a refresh
    usable_until: float  # after this, requests wait for Triton's answer
    stale: bool = False  # a refresh failed since Triton last answered (logged once)
    trusted: bool = True  # False once the served config may have changed: Triton's answer first (row 79)


class ModelSignatures:
    """The models' signatures; ``changes``: the launcher's file (None: only loads through this front)."""

    def __init__(self, fetch: Fetch, body_limit: int, changes: ConfigChanges | None = None) -> None:
        self.fetch, self.body_limit, self.changes = fetch, body_limit, changes
        self._entries: dict[Key, _Entry] = {}
        self._pending: dict[Key, asyncio.Future[Found]] = {}

    async def get(self, model: str, version: str = "") -> ModelSignature:
        """``model``'s signature, or Triton's refusal (``UNAVAILABLE``: no answer for a config not known)."""
        changed = self.changes.poll() if self.changes is not None else None
        if changed:  # the models it names are fetched again before their next check
            for key, entry in self._entries.items():
                if changed.covers(key[0]):
                    entry.trusted = False
            self._drop_fetches(changed.covers)
        key = (model, version)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and now < entry.usable_until:
            if not entry.trusted:  # the config Triton serves may differ from this one (row 79)
                return _known(_held_if_unanswered(entry, await asyncio.shield(self._loading(key))))
            if now >= entry.refresh_at:
                self._loading(key)  # in the background: this request goes on with what is known
            return _known(entry.found)
        return _known(await asyncio.shield(self._loading(key)))

    def forget(self, model: str) -> None:
        """``model`` was loaded or unloaded through this front: drop it, and tell the other front."""
        for key in [key for key in self._entries if key[0] == model]:
            del self._entries[key]
        self._drop_fetches(lambda name: name == model)
        if self.changes is not None:
            self.changes.mark(model)

    def _drop_fetches(self, of_model: Callable[[str], bool]) -> None:
        """Fetches in flight that may predate a change answer their waiting requests but are not kept."""
        for key in [key for key in self._pending if of_model(key[0])]:
            del self._pending[key]

    def _loading(self, key: Key) -> asyncio.Future[Found]:
        """The fetch of ``key``'s config in flight, started if none is."""
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._load(key))
            pending.add_done_callback(functools.partial(self._loaded, key))
        return pending

    async def _load(self, key: Key) -> Found:
        """The signature, Triton's refusal, or ``UNAVAILABLE`` when Triton did not answer."""
        try:
            config = await asyncio.wait_for(self.fetch(*key), FETCH_TIMEOUT_S)
            return ModelSignature.from_config(key[0], config, self.body_limit)
        except RequestRefusedError as refusal:  # Triton's answer: no such model (version)
            return refusal
        except Exception as error:  # Triton unreachable or silent
            log.debug("no config for model %r: %r", key[0], error)
            unanswered = RequestRefusedError(
                f"tritonserver is not reachable (starting, restarting or down), so the config of model "
                f"'{key[0]}' cannot be checked: {error!r}",
                Refusal.UNAVAILABLE,
            )
            unanswered.__cause__ = error
            return unanswered

    def _loaded(self, key: Key, load: asyncio.Future[Found]) -> None:
        if self._pending.get(key) is not load:
            return  # forgotten while it ran
        del self._pending[key]
        if load.cancelled():
            return
        found, now = load.result(), time.monotonic()
        entry = self._entries.get(key)
        if not _unanswered(found):
            ttl, usable = (TTL_S, STALE_S) if isinstance(found, ModelSignature) else (UNKNOWN_TTL_S,) * 2
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = _Entry(found, now + ttl, now + usable)
        elif entry is None or not isinstance(entry.found, ModelSignature) or now >= entry.usable_until:
            self._entries.pop(key, None)
        else:  # Triton did not answer a refresh: a known config stays in use until ``usable_until``
            entry.refresh_at = now + RETRY_S
            if not entry.stale:
                entry.stale = True
                log.warning(
                    "no config of model '%s' from tritonserver (%r): requests are checked against the one "
                    "it served last until it answers (for %.0f s more at most)",
                    key[0],
                    found.__cause__,
                    entry.usable_until - now,
                )


def _unanswered(found: Found) -> bool:
    return isinstance(found, RequestRefusedError) and found.kind is Refusal.UNAVAILABLE


def _held_if_unanswered(entry: _Entry, found: Found) -> Found:
    """Triton's answer for a config no longer trusted; the signature held when Triton gave none (row 74)."""
    return entry.found if _unanswered(found) and isinstance(entry.found, ModelSignature) else found


def _known(found: Found) -> ModelSignature:
    if isinstance(found, RequestRefusedError):
        raise RequestRefusedError(str(found), found.kind)  # a fresh one per request: no shared traceback
    return found
