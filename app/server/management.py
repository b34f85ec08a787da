"""What the management routes ask of the live service, one request at a
time: the repository index, model load and unload (app/server/model_control.py), a device's
share reallocated (app/server/reallocation.py) and a plan taken up while serving
(app/server/plan_switch.py). `LiveService` owns one `Management`, which works
through app/server/control_host.py's `ControlHost`."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from app.errors import ModelNotReady, ServingError, ShuttingDown, hide_paths
from app.repository.config import VERSION_KEY_SEP
from app.server import model_control, plan_switch, planning_index, reallocation
from app.server.control_host import ControlHost


class Management:
    """Model control, reallocation and plans, one at a time (under `_lock`)."""

    def __init__(self, service: ControlHost) -> None:
        self.service = service
        self._lock = asyncio.Lock()
        self._posted_plans: tempfile.TemporaryDirectory[str] | None = None

    async def load_model(self, name: str, config_override: str | None = None) -> None:
        """(Re)load `name`, every version it serves, from the repository,
        optionally with a config override (JSON) for all of them, without a
        restart (app/server/model_control.py)."""
        async with self._lock:
            self._check_serving()
            try:
                await model_control.load(self.service, name, config_override)
            except ServingError as exc:  # its text names no file of the server
                exc.message = self.public_reason(exc.message)
                exc.args = (exc.message,)
                raise

    async def unload_model(self, name: str) -> None:
        """Unload `name`, every version: it takes no new requests, those
        accepted are answered, then its executors and arenas let go of it."""
        async with self._lock:
            self._check_serving()
            await model_control.unload(self.service, name)

    async def reshare_device(self, name: str, share: float) -> dict[str, Any]:
        """Give device `name` a new share through a shadow executor, while
        serving (app/server/reallocation.py); what it did and how long."""
        async with self._lock:
            self._check_serving()
            return await reallocation.reshare(self.service, name, share)

    async def apply_plan(self, body: bytes) -> dict[str, Any]:
        """Take up the posted plan while serving (app/server/plan_switch.py)."""
        async with self._lock:
            self._check_serving()
            if self._posted_plans is None:  # kept while the server runs: GET /v2/plan names it
                self._posted_plans = tempfile.TemporaryDirectory(prefix="deadline-serve-plans-")
            plan = plan_switch.read_posted_plan(body, Path(self._posted_plans.name))
            try:
                return await plan_switch.switch_plan(self.service, plan)
            except ServingError as exc:  # its text names no file of the server
                exc.message = self.public_reason(exc.message)
                exc.args = (exc.message,)
                raise

    def device_index(self) -> list[dict[str, Any]]:
        """The executor devices, their shares and models."""
        return reallocation.device_index(self.service)

    def profile_index(self) -> list[dict[str, Any]]:
        """Each model's profile, SLO and tensors, for the planners
        (app/server/planning_index.py)."""
        return planning_index.profile_index(self.service.models, self.service.devices)

    def repository_index(self) -> list[dict[str, str]]:
        """Triton's repository index: every model and version, with its state."""
        service = self.service
        index = [
            {
                "name": state.config.model_name,
                "version": state.config.version,
                "state": "READY" if service.model_ready(name) else "UNAVAILABLE",
                "reason": service.control_state.get(name, ""),
            }
            for name, state in service.models.items()
        ]
        for name, config in (service.pipelines.configs if service.pipelines else {}).items():
            ready = "READY" if service.model_ready(name) else "UNAVAILABLE"
            index.append(
                {"name": config.model_name, "version": config.version, "state": ready, "reason": ""}
            )
        for key, reason in service.unavailable.items():
            loading = service.control_state.get(key) == "loading"
            name, _, version = key.partition(VERSION_KEY_SEP)
            index.append(
                {
                    "name": name,
                    "version": version or service.versions.get(key, "1"),
                    "state": "LOADING" if loading else "UNAVAILABLE",
                    "reason": self.public_reason(reason),
                }
            )
        return sorted(index, key=lambda entry: (entry["name"], entry["version"]))

    def public_reason(self, reason: str) -> str:
        """A load error as answers give it: files relative to the repository,
        any other absolute path cut to its last component."""
        return hide_paths(self.service.relative_to_repository(reason))

    def _check_serving(self) -> None:
        if self.service.closing:
            raise ShuttingDown("server is shutting down")
        if not self.service.ready or self.service.dispatcher is None:
            raise ModelNotReady("server is starting")
