"""`train.checkpoint_blocks`: activation checkpointing of each of the task's repeated blocks, whole.

Why beside `train.gradient_checkpointing`: a model's own checkpointing is what its authors chose to wrap;
diffusers' SVD UNet wraps its res blocks and the spatial transformer blocks but not the temporal ones,
which at 576x1024x14 keep gigabytes of feed-forward and attention activations alive until backward
(`framer-ds plan` measured 29.4 GiB per sample with the model's own checkpointing). Checkpointing every
repeated block (the list the task already gives FSDP2 and `train.compile`: `Task.fsdp_block_classes`)
keeps only each block's inputs, and recomputes one block at a time in backward. The forward is replaced on
the instance, so parameter names, state dicts, exports and checkpoints are unchanged; nested
checkpointing (a block whose own parts the model checkpoints) is what non-reentrant checkpointing
supports, at the price of recomputing those parts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation and sampling: nothing to save
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_repeated_blocks(model: torch.nn.Module, block_classes: list[str]) -> int:
    """Checkpoint every submodule whose class is one of `block_classes` (the outermost, where blocks
    nest); returns how many. A model naming no blocks is left alone (0): there is nothing to split."""
    wanted = set(block_classes)
    done: list[torch.nn.Module] = []
    for module in model.modules():
        if type(module).__name__ in wanted and not any(module in set(outer.modules()) for outer in done):
            module.forward = _checkpointed(module.forward)
            done.append(module)
    return len(done)
