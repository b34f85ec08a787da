"""Autoscaling that acts, in the daemon (AUTOSCALE): parked executors at the
start, started when the bad rate calls for them, released when idle — every
request answered once — and the pool's park and unpark on their own."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from app.errors import ServingError
from app.runtime.events import DeviceParked, DeviceUnparked
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from tests.test_statistics import emulated_repository


@pytest.mark.slow
@pytest.mark.anyio
async def test_devices_are_started_under_load_and_released_when_idle(tmp_path: Path, caplog):
    # ℓ(b) = 2 ms·b + 20 ms on each emulated device; SLO 150 ms.
    repository = emulated_repository(tmp_path / "models", {"m": 2.0}, slo_ms=150)
    settings = Settings(
        repository=repository,
        cpu_slices=0,
        respawn=False,
        emulated_devices=4,
        autoscale=(1, 4),
        autoscale_window_s=0.3,
        autoscale_cooldown_s=0.3,
    )
    service = LiveService(settings, Metrics())
    caplog.set_level(logging.INFO, logger="app.server")
    await service.start()
    outcomes: Counter[str] = Counter()
    try:
        pool = service.pool
        assert pool is not None and service.scaling is not None
        assert [pool.parking.parked(d) for d in range(4)] == [False, True, True, True]
        assert [pool.alive(d) for d in range(4)] == [True, False, False, False]
        ((_, scaler),) = service.scaling.scalers.values()

        async def client(stop: asyncio.Event) -> None:
            while not stop.is_set():
                try:
                    await service.infer("m", {"x": np.ones((1, 4), dtype=np.float32)})
                    outcomes["ok"] += 1
                except ServingError as exc:
                    outcomes[exc.reason] += 1

        stop = asyncio.Event()
        # 60 closed-loop clients: one device serves ~8 items per 36 ms.
        clients = [asyncio.create_task(client(stop)) for _ in range(60)]
        for _ in range(60):
            await asyncio.sleep(0.1)
            if len(scaler.serving) >= 2:
                break
        grown = len(scaler.serving)
        stop.set()
        await asyncio.gather(*clients)
        for _ in range(60):  # idle now: released back to one
            await asyncio.sleep(0.1)
            # The release is decided at once; parking (stopping the process)
            # ends later, longer on a loaded box.
            parked = sum(pool.parking.parked(d) for d in range(4))
            if len(scaler.serving) == 1 and not scaler.starting and parked == 3:
                break
        shrunk = len(scaler.serving)
        parked_after = [pool.parking.parked(d) for d in range(4)]
    finally:
        await service.stop()

    assert grown >= 2, [h for h in scaler.history]
    assert shrunk == 1 and sum(parked_after) == 3
    assert outcomes["ok"] > 100 and set(outcomes) <= {"ok", "deadline"}, outcomes
    assert service.outstanding("m") == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("autoscaling m: starting devices" in m for m in messages)
    assert any("autoscaling m: releasing devices" in m for m in messages)


@pytest.mark.slow
@pytest.mark.anyio
async def test_park_and_unpark_post_their_events_and_refuse_what_cannot_be(tmp_path: Path):
    repository = emulated_repository(tmp_path / "models", {"m": 1.0})
    events: list[object] = []
    settings = Settings(repository=repository, cpu_slices=0, emulated_devices=2)
    service = LiveService(settings, Metrics())
    await service.start()
    try:
        pool = service.pool
        assert pool is not None
        pool.events = events.append  # type: ignore[assignment]
        await pool.parking.park(1)
        # Parked, not crashed: in GET /v2/devices and in device_state alike.
        parked = {d["name"]: d["state"] for d in service.device_index()}
        exposed = service.metrics.render()[0].decode()
        with pytest.raises(ValueError, match="emulated:1 is parked already"):
            await pool.parking.park(1)
        with pytest.raises(ValueError, match="emulated:0 is not parked"):
            await pool.parking.unpark(0)
        with pytest.raises(ValueError, match="no device 9"):
            await pool.parking.park(9)
        took = await pool.parking.unpark(1)
        alive = pool.alive(1)
        unparked = {d["name"]: d["state"] for d in service.device_index()}
    finally:
        await service.stop()
    assert alive and took > 0
    assert parked == {"emulated:0": "serving", "emulated:1": "parked"}
    assert unparked == {"emulated:0": "serving", "emulated:1": "serving"}
    prefix = service.metrics.prefix
    assert f'{prefix}device_state{{device="emulated:1",state="parked"}} 1.0' in exposed
    assert f'{prefix}device_state{{device="emulated:1",state="down"}} 0.0' in exposed
    assert [type(e) for e in events] == [DeviceParked, DeviceUnparked]
