"""A network namespace joined to this one by a veth pair, for a Ray node
whose traffic crosses a real network stack (bench/ray_executors.py
`--netns`).

    with VethNamespace.create() as ns:
        ns.prefix        # ("ip", "netns", "exec", NAME): run a command inside
        ns.host_ip       # this side's address of the pair
        ns.ns_ip         # the namespace's address

The pair is a /30 of 10.231.0.0/16: the namespace has its loopback and that
one address, no route anywhere else, so whatever runs inside reaches only
the host side's address (and its own loopback). Everything is named and
numbered after this process (`dsr<pid>`, the /30 from the pid, so that two
runs at once do not meet), created with `ip` (root, iproute2), and removed
on leaving:
deleting the namespace deletes its end of the pair, and the host end goes
with it. Each `ip` command is bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from types import TracebackType

# The pairs' addresses: /30s of a private range.
PREFIX = "10.231"
IP_TIMEOUT_S = 10.0


class NamespaceError(RuntimeError):
    """The namespace or its veth pair could not be made (not root, no `ip`)."""


def _ip(*args: str) -> None:
    try:
        done = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"ip {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def available() -> str | None:
    """Why a namespace cannot be made here (None: it can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "not root (ip netns needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    return None


@dataclass
class VethNamespace:
    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    made: bool = False

    @classmethod
    def create(cls) -> VethNamespace:
        pid = os.getpid()
        tag = f"dsr{pid}"  # interface names: at most 15 bytes
        block = pid % (1 << 14)  # one /30 of the /16 per pid
        third, fourth = block >> 6, (block & 63) * 4
        return cls(
            tag,
            f"{tag}h",
            f"{tag}n",
            f"{PREFIX}.{third}.{fourth + 1}",
            f"{PREFIX}.{third}.{fourth + 2}",
        )

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def __enter__(self) -> VethNamespace:
        why = available()
        if why is not None:
            raise NamespaceError(why)
        _ip("netns", "add", self.name)
        self.made = True
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            inside = ("-n", self.name)
            _ip(*inside, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip(*inside, "link", "set", self.ns_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        if not self.made:
            return
        self.made = False
        for args in (("link", "del", self.host_if), ("netns", "del", self.name)):
            with contextlib.suppress(NamespaceError):  # gone with the other already
                _ip(*args)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()
