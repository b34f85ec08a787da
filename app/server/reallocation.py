"""Reallocating a device share while serving (inss.txt §5.3): the live side
of `ExecutorPool.reshare` (app/runtime/pool_reshare.py).

    POST /v2/devices/{name}/share   {"share": 0.3}     (app/api/device_routes.py)

`reshare(service, name, share)`:

1. checks what can be checked before anything starts — the device exists
   (404 naming the devices), the core driving it can change a device's speed
   while serving (`Scheduler.speed_changes`; 409 naming the policy), the
   share is in (0, 1] and the device's shares still sum to ≤ 1 (400 naming
   the numbers);
2. lets the pool start a shadow executor with the new share, load and warm
   it up, switch the device's traffic to it and retire the old one once it
   has finished the batches it held. At the switch the pool posts
   `DeviceReshared` and the dispatcher tells the core the device's new
   speed (`speed_ratio`: the share's, a CPU share's cores), so batches sent
   from then on are planned at the new share — those running on the old
   executor keep their planned end. Every request keeps its one answer;
3. answers what the pool reports: each phase's time, the old and new
   process, the batches the old one finished after the switch.

A reshare of a device already being reshared or respawned is 409; a shadow
that fails to start, load or warm up is 503 (`reshare_failed`) and the old
executor serves on at its share. Reshares and model loads run one at a time
(the service's management lock).

To move share from one model to another, shrink one share first, then grow
the other: the device's shares must sum to ≤ 1 at every step.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from app.errors import InvalidInput, ServingError
from app.runtime.pool_reshare import ReshareFailed, ReshareRefused
from app.server.control_host import ControlHost

log = logging.getLogger("app.server")


class DeviceNotFound(ServingError):
    status = 404
    reason = "device_not_found"


class ReshareConflict(ServingError):
    """The reshare cannot be made now, or not under this policy."""

    status = 409
    reason = "reshare_refused"


class ReshareUnavailable(ServingError):
    """The shadow executor did not come up; the old one serves on."""

    status = 503
    reason = "reshare_failed"


def device_index(service: ControlHost) -> list[dict[str, Any]]:
    """Every executor device: its name, kind, share, cores (a CPU share's),
    threads, whether it is serving (`alive`), its `state` (serving, parked,
    resharing, loading or down: app.runtime.pool_records), its Ray node
    (executors on Ray) and the models it serves; then the PPipe pipelines'
    devices, each with its device class."""
    pool = service.pool
    out = []
    for device in service.devices:
        current = pool.devices.get(device.id, device) if pool is not None else device
        out.append(
            {
                "name": current.name,
                "kind": current.kind,
                "share": current.share,
                "cpus": list(current.cpus) if current.cpus is not None else None,
                "threads": current.threads,
                "alive": pool is not None and pool.alive(device.id),
                "state": pool.state(device.id) if pool is not None else "down",
                **({"node": pool.node_of(device.id)} if hasattr(pool, "node_of") else {}),
                "models": sorted(
                    name for name, state in service.models.items() if device.id in state.devices
                ),
            }
        )
    if service.pipelines is not None:
        out += service.pipelines.device_index()
    return out


async def reshare(service: ControlHost, name: str, share: float) -> dict[str, Any]:
    """Give device `name` the share `share` (module docstring)."""
    pool, dispatcher = service.pool, service.dispatcher
    assert pool is not None and dispatcher is not None
    device = next((d for d in service.devices if d.name == name), None)
    if device is None:
        names = ", ".join(d.name for d in service.devices) or "none"
        raise DeviceNotFound(f"no device {name!r}; devices: {names}")
    group = next((g for g in dispatcher.groups if device.id in g.devices), None)
    if group is not None and not group.scheduler.speed_changes:
        raise ReshareConflict(
            f"policy {group.scheduler.name} plans with the devices' speeds fixed at start and "
            f"cannot take {name} at a new share while serving; use a policy that can "
            "(symphony, triton, inss, gpulet) or restart with the new DEVICE_SHARES"
        )
    try:
        done = await pool.reshare(device.id, share)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    except ReshareRefused as exc:
        raise ReshareConflict(str(exc)) from exc
    except ReshareFailed as exc:
        raise ReshareUnavailable(str(exc)) from exc
    service.devices = [pool.devices[d.id] if d.id == device.id else d for d in service.devices]
    log.info(
        "device %s reshared %g → %g in %.3f s (shadow up in %.3f s, switch %.6f s, old drained "
        "in %.3f s holding %d batch(es))",
        name,
        done.old_share,
        done.new_share,
        done.total_s,
        done.spawn_s + done.load_s + done.warmup_s,
        done.switch_s,
        done.drain_s,
        len(done.old_batches),
    )
    answer = dataclasses.asdict(done)
    answer["old_batches"] = len(done.old_batches)
    answer["cpus"] = list(done.cpus) if done.cpus is not None else None
    return answer
