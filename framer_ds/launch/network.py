"""The network interface gloo advertises, on a node whose own hostname resolves to loopback.

Why: gloo (torch's CPU backend, also used for CPU-side groups next to NCCL) tells its peers the address
its own hostname resolves to. Debian's installer, and many cloud images, map the machine's name to
`127.0.1.1` in /etc/hosts: every peer on another node is then told to connect to 127.0.1.1, its OWN
loopback, and the rendezvous fails with "connectFullMesh ... Connection refused, remote=[127.0.1.1]"
(seen on a real two-node Slurm cluster, tests/launch/test_cluster.py). `GLOO_SOCKET_IFNAME` set to the
interface that reaches the other nodes fixes it; this module finds that interface and sets it, before
the process group exists, and says so in one line.

NCCL is left alone: it picks its interfaces itself (InfiniBand first, then a non-loopback NIC) and does
not advertise the hostname's address, so `NCCL_SOCKET_IFNAME` would only narrow its choice.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import MutableMapping

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _resolve(host: str) -> str | None:
    """The first address of `host`, as gloo's getaddrinfo takes it; None when it does not resolve."""
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (socket.gaierror, IndexError, UnicodeError):
        return None


def interface_addresses() -> dict[str, str]:
    """{interface name: IPv4 address} of this network namespace, loopback included."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address, or down
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def _routed_source(address: str) -> str | None:
    """The local address the kernel would send from to reach `address` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((address, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def _default_route_interface() -> str | None:
    try:
        lines = open("/proc/net/route").read().splitlines()[1:]  # noqa: SIM115
    except OSError:
        return None
    return next((f[0] for f in (line.split() for line in lines) if len(f) > 1 and f[1] == "00000000"), None)


def cluster_interface(master_addr: str) -> str | None:
    """The interface the other nodes reach this one over: the one that routes to the head node; on the
    head node itself (its name resolves to loopback too), the default route's, else the only
    non-loopback one. None when that is ambiguous."""
    addresses = interface_addresses()
    by_address = {address: name for name, address in addresses.items()}
    master = _resolve(master_addr)
    if master is not None and not _is_loopback(master):
        source = _routed_source(master)
        if source in by_address and not _is_loopback(source):
            return by_address[source]
    outside = [name for name, address in addresses.items() if not _is_loopback(address)]
    default = _default_route_interface()
    if default in outside:
        return default
    return outside[0] if len(outside) == 1 else None


def _spans_machines(environ: MutableMapping[str, str]) -> bool:
    """More ranks than this machine runs (torchrun: LOCAL_WORLD_SIZE; DeepSpeed: LOCAL_SIZE). Without
    either, any launch whose head is not a loopback address may span machines."""
    world = int(environ.get("WORLD_SIZE", "1"))
    local = environ.get("LOCAL_WORLD_SIZE") or environ.get("LOCAL_SIZE")
    if local is not None:
        return world > int(local)
    return world > 1 and not _is_loopback(_resolve(environ.get("MASTER_ADDR", "127.0.0.1")) or "127.0.0.1")


def pin_gloo_interface(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Under a multi-node launch, on a node whose hostname resolves to a loopback address and with no
    GLOO_SOCKET_IFNAME set: set it to the interface that reaches the other nodes. Returns the line to
    tell the user (also when no interface could be chosen), or None when there was nothing to do."""
    environ = os.environ if environ is None else environ
    if environ.get("GLOO_SOCKET_IFNAME") or not _spans_machines(environ):
        return None
    host = socket.gethostname()
    own = _resolve(host)
    if own is None or not _is_loopback(own):
        return None
    interface = cluster_interface(environ.get("MASTER_ADDR", ""))
    why = f"{host} resolves to {own} (loopback, e.g. the `127.0.1.1 {host}` line of /etc/hosts)"
    if interface is None:
        return (
            f"warning: {why}: gloo would tell the other nodes to connect to that; set GLOO_SOCKET_IFNAME "
            "to the interface of the cluster network (e.g. GLOO_SOCKET_IFNAME=eth0)"
        )
    environ["GLOO_SOCKET_IFNAME"] = interface
    return (
        f"{why}: using GLOO_SOCKET_IFNAME={interface}, the interface that reaches the other nodes "
        "(set GLOO_SOCKET_IFNAME yourself to choose another)"
    )
