"""Each model's input shapes as Triton serves them, cached for the fronts (fault matrix row 37).

The fronts refuse a declared shape the model's config does not allow (``tensor_limits.check_fits_model``)
before Triton sees it, so they need each model's config. They ask Triton (``/v2/models/<m>/config``
or gRPC ``ModelConfig``) rather than read ``config.pbtxt``: what Triton serves is what it checks
against, whatever the repository on disk says since. A config is kept ``ttl_s`` seconds and dropped at
once when a load or unload of its model passes through the front, so a model loaded through the other
front or by the launcher is seen within ``ttl_s``. When Triton does not answer in ``timeout_s`` (or
the model is unknown), the check falls back to the bounds that need no config.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from server.fronts.tensor_limits import ModelShapes

log = logging.getLogger(__name__)
Fetch = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
MAX_ENTRIES = 1024  # requests naming many unknown models must not grow the cache without bound


class ModelShapesCache:
    """``await get(model, version)``: the model's ``ModelShapes`` or None; ``forget(model)`` on reloads.

    ``fetch(model, version)`` returns the config as a dict, or None when Triton has none for it.
    Concurrent requests for one model share one fetch."""

    def __init__(self, fetch: Fetch, ttl_s: float = 5.0, timeout_s: float = 5.0) -> None:
        self.fetch, self.ttl_s, self.timeout_s = fetch, ttl_s, timeout_s
        self._entries: dict[tuple[str, str], tuple[float, ModelShapes | None]] = {}
        self._pending: dict[tuple[str, str], asyncio.Future] = {}

    async def get(self, model: str, version: str = "") -> ModelShapes | None:
        key = (model, version)
        entry = self._entries.get(key)
        if entry is not None and time.monotonic() - entry[0] < self.ttl_s:
            return entry[1]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._load(key))
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(pending)

    async def _load(self, key: tuple[str, str]) -> ModelShapes | None:
        try:
            config = await asyncio.wait_for(self.fetch(*key), self.timeout_s)
            shapes = ModelShapes.from_config(key[0], config) if config else None
        except Exception as error:  # any failure: check without the config
            log.debug("no config for model %r: %r", key[0], error)
            shapes = None
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (time.monotonic(), shapes)
        return shapes

    def forget(self, model: str) -> None:
        """Drop what is known of ``model`` (every version): it is being loaded or unloaded."""
        for key in [key for key in self._entries if key[0] == model]:
            del self._entries[key]
