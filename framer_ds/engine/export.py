"""Consolidated weights for `final/`, correct under ZeRO-3 (gather on all ranks, write on rank 0)."""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator


def save_pretrained_gathered(accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
    """`save_pretrained` of the full model in safetensors. Call on EVERY rank (gathering is collective)."""
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
    accelerator.wait_for_everyone()
