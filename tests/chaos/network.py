"""Network faults between a contender and PostgreSQL, made by a real Toxiproxy.

Each network contender talks to the database through a proxy of its own (its "seat"),
so a toxic hits exactly one contender. A fault is a set of toxics that stays for a
window and is then removed ("healed"):

| kind                | toxics                                           | window         |
|---------------------|--------------------------------------------------|----------------|
| `net_blackhole`     | timeout=0 on both streams: a silent partition    | 0.2 s - lease + 0.8 s |
| `net_blackhole_up`  | timeout=0 client -> server only                  | same           |
| `net_blackhole_down`| timeout=0 server -> client only (the server acts, the answer is lost) | same |
| `net_latency`       | latency 50-400 ms with jitter 20-200 ms, one stream | 0.3-1.2 s   |
| `net_reset`         | reset_peer: connections (and reconnections) closed with RST | 0.1-0.6 s |
| `net_slicer`        | data cut into 1-64 byte pieces, 0.1-2 ms apart, one stream | 0.3-1.2 s |
| `net_bandwidth`     | 1-16 KB/s, one stream                            | 0.3-1.2 s      |

A blackhole's window reaches past the lease, so some partitioned holders are taken
over while cut off and must have their late writes refused after the heal.

Why healing matters here: a Toxiproxy blackhole is invisible to TCP-level bounds
(keepalives, `tcp_user_timeout`): the proxy's kernel acknowledges every byte it then
drops. A psycopg call in a blackhole returns only when a client-side deadline fires or
the toxic is removed (which closes the connections it held). The harness always heals,
so every call returns within the window.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from psycopg.conninfo import make_conninfo

from guardedcron_devenv.toxiproxy import Proxy
from tests.chaos.plan import NETWORK_FAULT_KINDS

STREAMS = ("upstream", "downstream")
# Bounds on connections the harness opens through a proxy. They end a connect attempt into
# a blackhole (connect_timeout) and would end a call on a real partition (the kernel's
# unacknowledged data: tcp_user_timeout; an idle peer: keepalives), though not on
# Toxiproxy's, which acknowledges what it drops; the harness heals those.
BOUNDS = {
    "connect_timeout": "2",
    "keepalives": "1",
    "keepalives_idle": "1",
    "keepalives_interval": "1",
    "keepalives_count": "2",
    "tcp_user_timeout": "2000",
}


def bounded_dsn(proxy: Proxy, dsn: str) -> str:
    """`dsn` through `proxy`, with libpq's own bounds on connecting and on a dead peer."""
    return make_conninfo(proxy.dsn_for(dsn), **BOUNDS)


@dataclass(frozen=True)
class Toxic:
    type: str
    stream: str
    attributes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NetworkFault:
    kind: str  # one of NETWORK_FAULT_KINDS
    toxics: tuple[Toxic, ...]
    window_seconds: float  # how long the toxics stay before the heal

    def describe(self) -> str:
        parts = [f"{t.type}/{t.stream}{t.attributes or ''}" for t in self.toxics]
        return f"{self.kind} {'+'.join(parts)} for {self.window_seconds:.2f} s"


def draw_fault(kind: str, rng: random.Random, lease_seconds: float) -> NetworkFault:
    """A fault of `kind` with its parameters drawn from `rng`."""
    slow_window = rng.uniform(0.3, 1.2)
    one_way = rng.choice(STREAMS)
    if kind.startswith("net_blackhole"):
        streams = {"net_blackhole": STREAMS, "net_blackhole_up": ("upstream",)}.get(kind, ("downstream",))
        toxics = tuple(Toxic("timeout", s, {"timeout": 0}) for s in streams)
        return NetworkFault(kind, toxics, rng.uniform(0.2, lease_seconds + 0.8))
    if kind == "net_latency":
        attributes = {"latency": rng.randint(50, 400), "jitter": rng.randint(20, 200)}
        return NetworkFault(kind, (Toxic("latency", one_way, attributes),), slow_window)
    if kind == "net_reset":
        return NetworkFault(kind, (Toxic("reset_peer", one_way, {"timeout": 0}),), rng.uniform(0.1, 0.6))
    if kind == "net_slicer":
        size = rng.randint(1, 64)
        attributes = {"average_size": size, "size_variation": size // 2, "delay": rng.randint(100, 2000)}
        return NetworkFault(kind, (Toxic("slicer", one_way, attributes),), slow_window)
    if kind == "net_bandwidth":
        return NetworkFault(kind, (Toxic("bandwidth", one_way, {"rate": rng.randint(1, 16)}),), slow_window)
    raise ValueError(f"unknown network fault kind {kind!r}; known: {NETWORK_FAULT_KINDS}")


class Strike:
    """One fault on one seat's proxy: applied by the victim's own thread just before it
    talks (so the toxic is in place while it does), healed by a timer after the window."""

    def __init__(self, proxy: Proxy, fault: NetworkFault) -> None:
        self.proxy = proxy
        self.fault = fault
        self.applied = False
        self.heal_error: BaseException | None = None
        self._timer: threading.Timer | None = None

    def apply(self) -> None:
        try:
            for toxic in self.fault.toxics:
                self.proxy.add_toxic(toxic.type, toxic.stream, **toxic.attributes)
        except BaseException:
            self.proxy.clear()  # never leave half a fault behind on a seat
            raise
        self.applied = True
        self._timer = threading.Timer(self.fault.window_seconds, self._heal)
        self._timer.daemon = True
        self._timer.start()

    def _heal(self) -> None:
        try:
            self.proxy.clear()
        except Exception as exc:  # reported by the harness: a seat left poisoned is a harness failure
            self.heal_error = exc

    def wait_healed(self) -> None:
        """Block until the heal has run (the window is short and bounded)."""
        if self._timer is not None:
            self._timer.join()
