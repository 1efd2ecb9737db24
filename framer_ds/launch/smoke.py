"""The rendezvous smoke test of `framer-ds env` under a launcher: can every rank reach every other?

Why before training: a 16-GPU job that hangs at rendezvous (every node thinks it is rank 0, the port
is taken, a node cannot reach the head, the wrong network interface) burns its allocation and says
nothing. This joins the process group with a short timeout, checks an all-reduce and times a 64 MiB
broadcast, and on failure names the error and the likely fix.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# (text in the error, what to check). First match wins; the last is the fallback.
_UNRESOLVED = "MASTER_ADDR does not resolve on this node: use the head node's IP or a name in /etc/hosts"
_NOT_ARRIVED = (
    "not every rank arrived in time: check that every node runs with the same MASTER_ADDR, MASTER_PORT "
    "and WORLD_SIZE, a distinct RANK (machine_rank), and can reach the head node's port (firewall, "
    "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"
)
HINTS = (
    (
        "address already in use",
        "MASTER_PORT is taken on the head node (another job, or a run that has not exited): choose another; "
        "slurm/train_multinode.sh derives one from the job id, MASTER_PORT=... overrides it",
    ),
    (
        "remote=[127.",
        "a rank on another node told its peers to connect to a loopback address: its hostname resolves "
        "to 127.x there (e.g. the `127.0.1.1 HOST` line of /etc/hosts). Set GLOO_SOCKET_IFNAME to the "
        "interface that reaches the other nodes (GLOO_SOCKET_IFNAME=eth0); framer-ds sets it itself when it "
        "can tell which one",
    ),
    ("name or service not known", _UNRESOLVED),
    ("nodename nor servname", _UNRESOLVED),
    (
        "connection refused",
        "nothing listens on MASTER_ADDR:MASTER_PORT: is rank 0 running, with the same MASTER_PORT? "
        "a firewall?",
    ),
    (
        "no route to host",
        "the head node is unreachable from here: check the network interface (GLOO_SOCKET_IFNAME / "
        "NCCL_SOCKET_IFNAME) and the firewall",
    ),
    (
        "nccl",
        "NCCL failed: rerun with NCCL_DEBUG=INFO; set NCCL_SOCKET_IFNAME to the cluster interface, "
        "NCCL_IB_DISABLE=1 without InfiniBand",
    ),
    ("timed out", _NOT_ARRIVED),
    ("timeout", _NOT_ARRIVED),
)
FALLBACK_HINT = (
    "run `framer-ds env` under the same launcher on every node and compare MASTER_ADDR, MASTER_PORT, "
    "WORLD_SIZE and RANK"
)


class SmokeTestFailed(RuntimeError):
    """The ranks could not talk; the message holds the backend's error and a hint."""


def hint_for(error: str) -> str:
    lowered = error.lower()
    return next((hint for needle, hint in HINTS if needle in lowered), FALLBACK_HINT)


def _resolve(host: str) -> None:
    """The backend retries an unknown name until its timeout and then reports a timeout; say it now."""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise OSError(f"MASTER_ADDR {host!r}: name or service not known ({exc})") from exc


def launched() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass
class RankLine:
    rank: int
    local_rank: int
    host: str
    device: str

    def __str__(self) -> str:
        return f"rank {self.rank}: host {self.host}, local rank {self.local_rank}, device {self.device}"


def run_smoke_test(timeout_s: float, payload_mib: int = 64) -> dict[str, Any]:
    """Call on every rank under a launcher (env:// rendezvous). Returns the same result on every rank."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    started = time.perf_counter()
    try:
        _resolve(os.environ.get("MASTER_ADDR", "127.0.0.1"))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), rank=rank, world_size=world)
        joined_s = time.perf_counter() - started
        total = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(total)
        expected = world * (world + 1) / 2
        if float(total.item()) != expected:
            raise SmokeTestFailed(f"all-reduce gave {total.item()}, expected {expected}: the ranks disagree")
        payload = torch.full((payload_mib * 2**20 // 4,), float(rank == 0), device=device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(payload, src=0)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if float(payload[-1].item()) != 1.0:
            raise SmokeTestFailed("the broadcast did not deliver rank 0's data")
        lines: list[Any] = [None] * world
        mine = RankLine(rank, local_rank, socket.gethostname(), str(device))
        dist.all_gather_object(lines, mine)
    except SmokeTestFailed:
        raise
    except Exception as exc:  # the backend's own error text is the diagnosis
        text = f"{type(exc).__name__}: {exc}".strip()
        raise SmokeTestFailed(
            f"rank {rank} of {world} could not complete the rendezvous at {where} with {backend} within "
            f"{timeout_s:g} s: {text.splitlines()[0] if text else type(exc).__name__}\nhint: {hint_for(text)}"
        ) from exc
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return {
        "backend": backend,
        "world_size": world,
        "master": where,
        "join_s": round(joined_s, 3),
        "all_reduce": "ok",
        "broadcast_mib": payload_mib,
        "broadcast_s": round(seconds, 4),
        "broadcast_gib_per_s": round(payload_mib / 1024 / max(seconds, 1e-9), 3),
        "ranks": [vars(line) for line in lines],
    }


def format_smoke_test(result: dict[str, Any]) -> str:
    lines = [
        f"rendezvous: {result['world_size']} ranks at {result['master']} over {result['backend']} in "
        f"{result['join_s']} s; all-reduce ok; broadcast of {result['broadcast_mib']} MiB in "
        f"{result['broadcast_s']} s ({result['broadcast_gib_per_s']} GiB/s)",
    ]
    lines += [str(RankLine(**line)) for line in result["ranks"]]
    return "\n".join(lines)
