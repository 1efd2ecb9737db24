"""The hardware a `framer-ds plan` targets: GPUs per node, nodes, each GPU's memory and the node's host
memory, and how much of a GPU the tensors may use.

Why its own module: a GPU's memory is not all the tensors'. The allowance kept for the CUDA context,
kernels' workspaces and the caching allocator's fragmentation is a fact about the device, stated once
here, and every per-strategy figure (planner.py) is compared with what it leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
ALLOWANCE_FIXED = GiB
"""CUDA context and kernel workspaces (cuBLAS, NCCL): ~0.5-1 GiB on an H100 with torch 2.x."""
ALLOWANCE_SHARE = 0.05
"""The caching allocator's rounding and fragmentation, as a share of the GPU."""


@dataclass(frozen=True)
class Hardware:
    """The cluster a plan is for; `usable` is what the tensors may take of one GPU."""

    gpus_per_node: int
    nodes: int
    gpu_bytes: int
    cpu_bytes: int | None = None
    """Host memory per node, for the offload strategies; None: not checked."""

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def allowance(self) -> int:
        return ALLOWANCE_FIXED + int(ALLOWANCE_SHARE * self.gpu_bytes)

    @property
    def usable(self) -> int:
        return self.gpu_bytes - self.allowance

    def problems(self) -> list[str]:
        if self.usable <= 0:
            return [
                f"{self.gpu_bytes / GiB:.2f} GiB per GPU leaves nothing after the {self.allowance / GiB:.2f} "
                "GiB allowance for the CUDA context and fragmentation; give the GPU's memory, e.g. 40GB"
            ]
        return []
