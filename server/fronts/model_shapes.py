"""Each served model's config as the fronts check requests against it, cached (fault matrix rows 37
and 53). Asked of Triton, not read from disk: what Triton serves is what it runs.

A config is kept ``TTL_S`` and forgotten when a load or unload passes through the front. A model
Triton has no config for is refused with Triton's own 404 / ``NOT_FOUND`` (kept ``UNKNOWN_TTL_S``);
while Triton does not answer, 503 / ``UNAVAILABLE``, never kept. Nothing is forwarded unchecked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from server.fronts.allow_list import ModelSignature
from server.fronts.refusal import Refusal, RequestRefusedError

log = logging.getLogger(__name__)
# fetch(model, version): the config as a dict, RequestRefusedError with Triton's answer when it has
# none for that model, any other exception when Triton cannot be asked
Fetch = Callable[[str, str], Awaitable[Mapping[str, Any]]]
TTL_S = 5.0  # how long a config is kept
UNKNOWN_TTL_S = 1.0  # how long Triton's "no such model" is kept
FETCH_TIMEOUT_S = 5.0  # how long Triton may take to answer for a config
MAX_ENTRIES = 1024  # requests naming many unknown models must not grow the cache without bound


class ModelSignatures:
    """``await get(model, version)``: the model's ``ModelSignature`` (one fetch for concurrent
    requests), or ``RequestRefusedError``; ``forget(model)`` on loads and unloads."""

    def __init__(self, fetch: Fetch, body_limit: int) -> None:
        self.fetch, self.body_limit = fetch, body_limit
        self._entries: dict[tuple[str, str], tuple[float, ModelSignature | RequestRefusedError]] = {}
        self._pending: dict[tuple[str, str], asyncio.Future] = {}

    async def get(self, model: str, version: str = "") -> ModelSignature:
        key = (model, version)
        entry = self._entries.get(key)
        if entry is not None and time.monotonic() < entry[0]:
            return _known(entry[1])
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._load(key))
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return _known(await asyncio.shield(pending))

    async def _load(self, key: tuple[str, str]) -> ModelSignature | RequestRefusedError:
        try:
            config = await asyncio.wait_for(self.fetch(*key), FETCH_TIMEOUT_S)
            found: ModelSignature | RequestRefusedError = ModelSignature.from_config(
                key[0], config, self.body_limit
            )
            expires = time.monotonic() + TTL_S
        except RequestRefusedError as refusal:  # Triton's answer: no such model (version)
            found, expires = refusal, time.monotonic() + UNKNOWN_TTL_S
        except Exception as error:  # Triton unreachable or silent: refuse, remember nothing
            log.debug("no config for model %r: %r", key[0], error)
            return RequestRefusedError(
                f"tritonserver is not reachable (starting, restarting or down), so the config of model "
                f"'{key[0]}' cannot be checked: {error!r}",
                Refusal.UNAVAILABLE,
            )
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (expires, found)
        return found

    def forget(self, model: str) -> None:
        """Drop what is known of ``model`` (every version): it is being loaded or unloaded."""
        for key in [key for key in self._entries if key[0] == model]:
            del self._entries[key]


def _known(found: ModelSignature | RequestRefusedError) -> ModelSignature:
    if isinstance(found, RequestRefusedError):
        raise RequestRefusedError(str(found), found.kind)  # a fresh one per request: no shared traceback
    return found
