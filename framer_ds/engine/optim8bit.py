"""`train.optimizer.name: adamw_8bit`: torchao's AdamW8bit behind torch's float-learning-rate contract.

Why a subclass: torchao's optimizers keep each group's "lr" as a tensor and raise at `step()` when
anything wrote a float there; torch's LR schedulers, the resume path (engine/resume/running_config.py)
and the metrics line all read and write floats. Here "lr" stays a float between steps and becomes a
tensor only inside `step()`, so everything else treats this optimizer as an AdamW.

The moments are `OptimState8bit` tensors (uint8 codes + one fp32 scale per block of 256 values);
torch.save / torch.load (weights_only too) and `Optimizer.load_state_dict` keep them quantized, so a
checkpoint resumes bit for bit (tests/train/test_optimizer_8bit.py).

Why `step()` turns AOTAutograd's on-disk cache off: torchao compiles one update per parameter shape.
Under FSDP2 the parameters are DTensors, and torch (2.13) keys that cache by the DTensor's global
shape and placements only, not by the rank's local shard (pytorch/pytorch#188390). With a shard split
unevenly (a 3-row head on 2 ranks: 2 rows and 1 row) every run after the first loads rank 0's update
on rank 1: it read past the shard and crashed (SIGSEGV), or trained on wrong moments without a word.
Inductor's own kernel cache stays on (its key holds the local shapes), so only the cheap tracing is
redone per run.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

BLOCK_SIZE = 256
"""Values per fp32 scale (torchao's default)."""
MIN_QUANTIZED_NUMEL = 4096
"""torchao (after bitsandbytes) keeps fp32 moments for tensors smaller than this or not a multiple of
the block size; the planner counts them so (`state_bytes`)."""


def adamw_8bit(groups: list[dict[str, Any]], **hyper: Any) -> torch.optim.Optimizer:
    """torchao's AdamW8bit over `groups` with float learning rates (see the module docstring)."""
    from torchao.optim import AdamW8bit

    class FloatLrAdamW8bit(AdamW8bit):
        def add_param_group(self, param_group: dict) -> None:
            torch.optim.Optimizer.add_param_group(self, param_group)

        @torch.no_grad()
        def step(self, closure=None):  # torch's Optimizer.step signature
            groups = self.param_groups
            for group in groups:
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32)
            try:
                with _without_autograd_disk_cache():
                    return super().step(closure)
            finally:
                for group in groups:
                    group["lr"] = float(group["lr"])

    return FloatLrAdamW8bit(groups, block_size=BLOCK_SIZE, **hyper)


def _without_autograd_disk_cache() -> contextlib.AbstractContextManager:
    """AOTAutograd's on-disk cache off for what compiles inside (module docstring); a no-op on a torch
    without that cache."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "enable_autograd_cache"):
        return contextlib.nullcontext()
    return functorch_config.patch(enable_autograd_cache=False)


def state_bytes(numel: int) -> float:
    """Bytes of AdamW8bit's two moments for one parameter tensor of `numel` values."""
    if numel >= MIN_QUANTIZED_NUMEL and numel % BLOCK_SIZE == 0:
        return 2 * (numel + 4 * numel / BLOCK_SIZE)
    return 8.0 * numel
