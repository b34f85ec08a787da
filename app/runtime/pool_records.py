"""What an executor pool answers from its per-device records, the same for
executor processes (app/runtime/pool.py, `Worker`) and Ray actors
(app/runtime/ray_pool.py, `Actor`): which models a device will load, which
it loaded or failed to, and how often it was restarted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from app.repository.config import ModelConfig
from app.runtime.devices import ExecutorDevice, model_allowed_on


def pool_inputs(
    devices: Sequence[ExecutorDevice], configs: Mapping[str, ModelConfig] | Iterable[ModelConfig]
) -> tuple[dict[int, ExecutorDevice], dict[str, ModelConfig]]:
    """A pool's devices by id (ids unique) and its model configs by name,
    from what both pools' constructors take."""
    by_id = {d.id: d for d in devices}
    if len(by_id) != len(devices):
        raise ValueError("device ids must be unique")
    if isinstance(configs, Mapping):
        return by_id, dict(configs)
    return by_id, {c.name: c for c in configs}


def check_watchdog_rules(stuck_factor: float, stuck_margin_s: float, timeout_s: float) -> None:
    """The watchdog's settings (app.runtime.watchdog; 0 turns a rule off)."""
    if stuck_factor < 0 or stuck_margin_s < 0 or timeout_s < 0:
        raise ValueError(
            "stuck_factor, stuck_margin_s and heartbeat_timeout_s must be ≥ 0, got "
            f"{stuck_factor}, {stuck_margin_s} and {timeout_s}"
        )


class ExecutorRecord(Protocol):
    """The fields of a device's record these answers read."""

    models: list[str]
    load_errors: dict[str, str]
    load_info: dict[str, str]
    dead: bool
    loading: bool
    restarts: int
    last_respawn_s: float | None


class DeviceRecords:
    """Per-device answers of a pool whose `_records()` maps each device id
    to its executor's record."""

    devices: dict[int, ExecutorDevice]
    configs: dict[str, ModelConfig]

    def _records(self) -> Mapping[int, ExecutorRecord]:
        raise NotImplementedError

    def alive(self, device_id: int) -> bool:
        raise NotImplementedError

    def parked(self, device_id: int) -> bool:
        raise NotImplementedError

    def resharing(self, device_id: int) -> bool:
        """Whether a shadow executor is taking over the device's share."""
        return False

    def state(self, device_id: int) -> str:
        """`serving`, `parked` (stopped on purpose), `resharing`, `loading`
        (starting or loading models) or `down` (failed; restarting)."""
        if self.parked(device_id):
            return "parked"
        if self.resharing(device_id):
            return "resharing"
        if self.alive(device_id):
            return "serving"
        record = self._records()[device_id]
        return "loading" if record.loading and not record.dead else "down"

    def placement(self, device_id: int) -> list[str]:
        """Models the device will load (backend supports it, config allows it)."""
        device = self.devices[device_id]
        return [n for n, c in self.configs.items() if model_allowed_on(c, device)]

    def models_on(self, device_id: int) -> list[str]:
        """Models loaded successfully on the device."""
        return list(self._records()[device_id].models)

    def devices_for(self, model: str) -> list[int]:
        return [i for i, r in self._records().items() if model in r.models and not r.dead]

    def load_errors(self, device_id: int) -> dict[str, str]:
        return dict(self._records()[device_id].load_errors)

    def load_info(self, device_id: int) -> dict[str, str]:
        """Per loaded model, a short description (backend, ORT providers)."""
        return dict(self._records()[device_id].load_info)

    def restarts(self, device_id: int) -> int:
        return self._records()[device_id].restarts

    def last_respawn_s(self, device_id: int) -> float | None:
        """Seconds from the failure to serving again, of the last restart."""
        return self._records()[device_id].last_respawn_s
