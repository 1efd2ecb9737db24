"""Where a LoRA goes in diffusers' `LTX2VideoTransformer3DModel`: the video branch of every block.

Targets: video self-attention (`attn1`) and prompt cross-attention (`attn2`) q/k/v/out and the video
feed-forward (`ff.net.0.proj`, `ff.net.2`), what LTX-2's own trainer (ltx-trainer's video-only LoRA) and
diffusers' LTX-2 LoRA examples train. As peft `target_modules` each matches `transformer_blocks.N.<name>`
only: peft matches an entry by suffix after a dot, so `attn1.to_q` never matches `audio_attn1.to_q`, nor
`ff.net.2` `audio_ff.net.2`: the audio branch and the audio<->video cross-attention stay frozen.
"""

from __future__ import annotations

from typing import Any

import torch

LTX2_LORA_TARGETS = (
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
)


def lora_targets(lora: Any) -> list[str]:
    """model.lora's own modules when the config names others than the default, else LTX2_LORA_TARGETS
    (the default names SVD's attention layers: a resolved config dumps every key, so the value, not
    whether it was set, tells a user's choice apart)."""
    default = type(lora).model_fields["target_modules"].get_default(call_default_factory=True)
    named = lora.target_modules != default or lora.include_feed_forward or lora.include_projections
    return lora.targets() if named else list(LTX2_LORA_TARGETS)


def unwrapped(model: torch.nn.Module) -> Any:
    """The LTX-2 transformer inside a prepared model (DDP/DeepSpeed `.module`, then peft's), for what is
    not a forward: its RoPE coordinates and config."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def to_diffusers_state_dict(peft_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft keys (`base_model.model.<module>.lora_A.weight`) -> diffusers' (`transformer.<module>.lora_A
    .weight`), the layout `LTX2*Pipeline.load_lora_weights` reads; peft's alpha travels in the file's
    `lora_adapter_metadata` header (diffusers' `save_lora_weights`), so B is not rescaled."""
    return {
        f"transformer.{k.removeprefix('base_model.model.')}": v.contiguous()
        for k, v in peft_state_dict.items()
    }
