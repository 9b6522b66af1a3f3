"""An emulated rack of network namespaces (root only): hosts cabled to switches by veth links.

Single switch (``workers_per_tor=None``)::

    w0 ─┐
    w1 ─┤  sw  ├─ ps          every host has its own link to the switch namespace
    ... ┘

Tree (``workers_per_tor=k``): workers ``k`` per ToR namespace, every ToR and the parameter-server
host cabled to one ``core`` namespace (iSwitch Fig. 10 / the Fig. 15 setting).

Switch namespaces forward ordinary IPv4 (``ip_forward=1``), as a real switch would; the
aggregation daemon runs inside them. Link ``k`` is ``10.77.k.0/24`` with the upper (switch) end
``.1`` and the lower end ``.2``. Both directions of every link are shaped by ``tc tbf`` to
``rate_mbit`` (``netem`` is not needed: loss and delay come from the daemon's own options).

Everything is named with a per-rack prefix and removed by `Rack.down` (also on failure in `up`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field

NETNS_DIR = "/var/run/netns"
"""Where ``ip netns add`` pins named namespaces."""
_CLONE_NEWNET = 0x40000000


def netns_available() -> str | None:
    """``None`` if racks can be built here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` tool (iproute2)"
    probe = f"gmiprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` fails: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def enter_netns(name: str) -> None:
    """Move the calling thread into the network namespace ``name`` (made by ``ip netns add``):
    what ``ip netns exec`` does for a new process, done in place with setns(2). Sockets opened,
    threads started and processes forked afterwards live there: call it before any of those.

    Raises:
        OSError: no such namespace, or not permitted (root is needed).
    """
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _run(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


@dataclass
class Link:
    upper_ns: str
    lower_ns: str
    index: int

    @property
    def upper_ip(self) -> str:
        return f"10.77.{self.index}.1"

    @property
    def lower_ip(self) -> str:
        return f"10.77.{self.index}.2"


@dataclass
class Rack:
    """Build with `up` (or ``with Rack(...) as rack``), remove with `down`.

    Args:
        num_workers: worker hosts ``w0..w{n-1}``.
        workers_per_tor: ``None`` for one switch; else workers per ToR under one core.
        rate_mbit: tbf rate of every link direction, Mbit/s; 0: unshaped veth links.
        mtu: MTU of every link, bytes.
        with_ps: add a parameter-server host ``ps`` on the (core) switch.

    Attributes (after `up`): ``worker_ip[i]``, ``worker_gateway[i]`` (the address of worker i's
    switch on its link), ``worker_dev[i]`` (its interface), ``ps_ip``, ``tor_parent_ip[j]`` (the core's address on ToR j's link),
    ``ns`` (role -> namespace name: ``"w0"``, ``"sw"``/``"core"``, ``"t0"``, ``"ps"``).
    """

    num_workers: int
    workers_per_tor: int | None = None
    rate_mbit: float = 100.0
    mtu: int = 9000
    with_ps: bool = True
    prefix: str = field(default_factory=lambda: f"gmi{os.getpid() % 100000}")
    ns: dict = field(default_factory=dict)
    links: list = field(default_factory=list)
    worker_ip: list = field(default_factory=list)
    worker_gateway: list = field(default_factory=list)
    worker_dev: list = field(default_factory=list)
    tor_parent_ip: list = field(default_factory=list)
    ps_ip: str | None = None

    def __enter__(self) -> "Rack":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    @property
    def tors(self) -> int:
        if self.workers_per_tor is None:
            return 0
        return -(-self.num_workers // self.workers_per_tor)

    @property
    def root(self) -> str:
        """Role name of the top switch namespace: ``"sw"`` or ``"core"``."""
        return "sw" if self.workers_per_tor is None else "core"

    def up(self) -> "Rack":
        """Create namespaces, links, addresses, routes and shaping.

        Raises:
            RuntimeError: a command failed (everything made so far is removed first).
        """
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _add_ns(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        _run("ip", "netns", "add", name)
        self.ns[role] = name
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _link(self, upper_role: str, lower_role: str) -> Link:
        k = len(self.links)
        link = Link(self.ns[upper_role], self.ns[lower_role], k)
        self.links.append(link)
        a, b = f"{self.prefix}u{k}", f"{self.prefix}l{k}"
        _run("ip", "link", "add", a, "mtu", str(self.mtu), "type", "veth", "peer", "name", b,
             "mtu", str(self.mtu))
        _run("ip", "link", "set", a, "netns", link.upper_ns)
        _run("ip", "link", "set", b, "netns", link.lower_ns)
        for ns, dev, ip in ((link.upper_ns, a, link.upper_ip), (link.lower_ns, b, link.lower_ip)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            if self.rate_mbit > 0:
                burst = max(64 * 1024, 4 * self.mtu)
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                     "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "limit", str(4 << 20))
        return link

    def _build(self) -> None:
        root = self._add_ns(self.root)
        _run("ip", "netns", "exec", root, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for j in range(self.tors):
            t = self._add_ns(f"t{j}")
            _run("ip", "netns", "exec", t, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            up = self._link(self.root, f"t{j}")
            self.tor_parent_ip.append(up.upper_ip)
            _run("ip", "-n", t, "route", "add", "default", "via", up.upper_ip)
        for i in range(self.num_workers):
            self._add_ns(f"w{i}")
            sw = self.root if self.workers_per_tor is None else f"t{i // self.workers_per_tor}"
            link = self._link(sw, f"w{i}")
            self.worker_ip.append(link.lower_ip)
            self.worker_gateway.append(link.upper_ip)
            self.worker_dev.append(f"{self.prefix}l{link.index}")
            _run("ip", "-n", self.ns[f"w{i}"], "route", "add", "default", "via", link.upper_ip)
            if self.workers_per_tor is not None:
                tor_link = self.links[i // self.workers_per_tor]
                _run("ip", "-n", root, "route", "add", f"10.77.{link.index}.0/24", "via",
                     tor_link.lower_ip)
        if self.with_ps:
            self._add_ns("ps")
            link = self._link(self.root, "ps")
            self.ps_ip = link.lower_ip
            _run("ip", "-n", self.ns["ps"], "route", "add", "default", "via", link.upper_ip)

    def popen(self, role: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside the namespace of ``role`` (``"w3"``, ``"sw"``, ``"t0"``...)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns[role], *argv], **kw)

    def switch_roles(self) -> list[str]:
        """The roles that run switches: the root, then the ToRs."""
        return [self.root] + [f"t{j}" for j in range(self.tors)]

    def cpu_seconds(self, roles: list[str] | None = None) -> float:
        """CPU seconds (user + system, all threads) used so far by the processes now in the
        rack's namespaces (``roles``: only those). Kernel work done outside them (softirqs run by
        ``ksoftirqd``) is not counted."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for name in (self.ns[r] for r in roles) if roles is not None else self.ns.values():
            r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in r.stdout.split():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                total += int(fields[11]) + int(fields[12])
        return total / tick

    def down(self) -> None:
        """Kill whatever still runs in the rack's namespaces and delete them. Idempotent."""
        for name in list(self.ns.values()):
            r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.ns.clear()
        self.links.clear()


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces whose name starts with ``prefix`` (a test's cleanup check)."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(prefix)]
