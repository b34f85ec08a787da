"""What the management routes ask of the live service, one request at a
time: the repository index, model load and unload (app/server/model_control.py) and a device's
share reallocated (app/server/reallocation.py). `LiveService` inherits it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from app.errors import ModelNotReady, ServingError, ShuttingDown, hide_paths
from app.repository.config import VERSION_KEY_SEP
from app.server import model_control, planning_index, reallocation

if TYPE_CHECKING:
    from app.server.live import LiveService


class Management:
    """Model control and reallocation, under one lock (`_control_lock`)."""

    _control_lock: asyncio.Lock

    async def load_model(self: LiveService, name: str, config_override: str | None = None) -> None:
        """(Re)load `name`, every version it serves, from the repository,
        optionally with a config override (JSON) for all of them, without a
        restart (app/server/model_control.py)."""
        async with self._control_lock:
            self._check_serving()
            try:
                await model_control.load(self, name, config_override)
            except ServingError as exc:  # its text names no file of the server
                exc.message = self.public_reason(exc.message)
                exc.args = (exc.message,)
                raise

    async def unload_model(self: LiveService, name: str) -> None:
        """Unload `name`, every version: it takes no new requests, those
        accepted are answered, then its executors and arenas let go of it."""
        async with self._control_lock:
            self._check_serving()
            await model_control.unload(self, name)

    async def reshare_device(self: LiveService, name: str, share: float) -> dict[str, Any]:
        """Give device `name` a new share through a shadow executor, while
        serving (app/server/reallocation.py); what it did and how long."""
        async with self._control_lock:
            self._check_serving()
            return await reallocation.reshare(self, name, share)

    def device_index(self: LiveService) -> list[dict[str, Any]]:
        """The executor devices, their shares and models."""
        return reallocation.device_index(self)

    def profile_index(self: LiveService) -> list[dict[str, Any]]:
        """Each model's profile, SLO and tensors, for the planners
        (app/server/planning_index.py)."""
        return planning_index.profile_index(self.models, self.devices)

    def repository_index(self: LiveService) -> list[dict[str, str]]:
        """Triton's repository index: every model and version, with its state."""
        index = [
            {
                "name": state.config.model_name,
                "version": state.config.version,
                "state": "READY" if self.model_ready(name) else "UNAVAILABLE",
                "reason": self.control_state.get(name, ""),
            }
            for name, state in self.models.items()
        ]
        for name, config in (self.pipelines.configs if self.pipelines else {}).items():
            ready = "READY" if self.model_ready(name) else "UNAVAILABLE"
            index.append(
                {"name": config.model_name, "version": config.version, "state": ready, "reason": ""}
            )
        for key, reason in self.unavailable.items():
            loading = self.control_state.get(key) == "loading"
            name, _, version = key.partition(VERSION_KEY_SEP)
            index.append(
                {
                    "name": name,
                    "version": version or self.versions.get(key, "1"),
                    "state": "LOADING" if loading else "UNAVAILABLE",
                    "reason": self.public_reason(reason),
                }
            )
        return sorted(index, key=lambda entry: (entry["name"], entry["version"]))

    def public_reason(self: LiveService, reason: str) -> str:
        """A load error as answers give it: files relative to the repository,
        any other absolute path cut to its last component."""
        return hide_paths(self._relative(reason))

    def _check_serving(self: LiveService) -> None:
        if self.closing:
            raise ShuttingDown("server is shutting down")
        if not self.ready or self.dispatcher is None:
            raise ModelNotReady("server is starting")
