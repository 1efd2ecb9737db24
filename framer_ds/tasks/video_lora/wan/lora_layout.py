"""Where a LoRA goes in diffusers' `WanTransformer3DModel`, and the two file layouts the ecosystem loads.

Targets: every linear layer of every transformer block: self-attention (`attn1`) q/k/v/out,
cross-attention (`attn2`) q/k/v/out plus the image tokens' own key/value projections
(`add_k_proj`/`add_v_proj`, Wan 2.1 I2V/FLF2V only) and the feed-forward (`ffn.net.0.proj`, `ffn.net.2`).
That is musubi-tuner's Wan LoRA (`networks/lora_wan.py`: every Linear inside `WanAttentionBlock`) and what
the original Wan / ComfyUI LoRA layout names per block; finetrainers' Wan examples train the attention
projections only (`--target_modules "blocks.*(to_q|to_k|to_v|to_out.0)"`). The embedders, time
projection and output head are left frozen by all three.

Layouts:
- diffusers (`to_diffusers_state_dict`): `transformer.blocks.N.attn1.to_q.lora_A.weight` / `lora_B`, the
  keys `WanImageToVideoPipeline.load_lora_weights` reads directly. diffusers loads such a file with
  lora_alpha = rank (scale 1), so peft's scale (alpha / r, or alpha / sqrt(r) with rsLoRA) is folded
  into lora_B.
- ComfyUI / original Wan (`to_comfyui_state_dict`): `diffusion_model.blocks.N.self_attn.q.lora_down.weight`,
  `.lora_up.weight`, `.alpha` (ComfyUI scales by alpha / rank), module names of the original Wan model
  (`self_attn.{q,k,v,o}`, `cross_attn.{q,k,v,o,k_img,v_img}`, `ffn.0`, `ffn.2`). diffusers'
  `_convert_non_diffusers_wan_lora_to_diffusers` reads the same file back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from framer_ds.tasks.video_lora.shared.comfyui_lora import lora_scale

# Block-relative module names; as peft `target_modules` each matches `blocks.N.<name>` only (peft matches
# a list entry by suffix after a dot, and no module outside the blocks ends in these names).
SELF_ATTENTION_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0")
CROSS_ATTENTION_TARGETS = ("attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0")
IMAGE_ATTENTION_TARGETS = ("attn2.add_k_proj", "attn2.add_v_proj")
FEED_FORWARD_TARGETS = ("ffn.net.0.proj", "ffn.net.2")
WAN_LORA_TARGETS = (
    SELF_ATTENTION_TARGETS + CROSS_ATTENTION_TARGETS + IMAGE_ATTENTION_TARGETS + FEED_FORWARD_TARGETS
)

# diffusers module (block-relative) -> original Wan / ComfyUI module: the inverse of diffusers'
# `_convert_non_diffusers_wan_lora_to_diffusers` (loaders/lora_conversion_utils.py).
COMFYUI_MODULES = {
    "attn1.to_q": "self_attn.q",
    "attn1.to_k": "self_attn.k",
    "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q",
    "attn2.to_k": "cross_attn.k",
    "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o",
    "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}
_PEFT_PREFIXES = ("base_model.model.", "transformer.")
_MODULE = re.compile(r"^blocks\.(\d+)\.(.+)\.lora_([AB])\.weight$")


def _lora_pairs(
    peft_state_dict: Mapping[str, torch.Tensor],
) -> dict[str, tuple[int, torch.Tensor, torch.Tensor]]:
    """peft tensors (`get_peft_model_state_dict`: with or without "base_model.model.") -> {module:
    (block, lora_A, lora_B)}; a key that is not a block's linear LoRA matrix is refused by name."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    blocks: dict[str, int] = {}
    for key, tensor in peft_state_dict.items():
        name = key
        for prefix in _PEFT_PREFIXES:
            name = name.removeprefix(prefix)
        match = _MODULE.match(name)
        if match is None or match[2] not in COMFYUI_MODULES:
            raise ValueError(
                f"{key} is not a LoRA matrix of a Wan block's linear layer ({', '.join(WAN_LORA_TARGETS)}); "
                "train with target_modules inside WAN_LORA_TARGETS"
            )
        module = f"blocks.{match[1]}.{match[2]}"
        blocks[module] = int(match[1])
        found.setdefault(module, {})[match[3]] = tensor
    pairs = {}
    for module, parts in sorted(found.items()):
        if set(parts) != {"A", "B"}:
            raise ValueError(f"{module} has lora_{''.join(parts)} only; an adapter needs lora_A and lora_B")
        pairs[module] = (blocks[module], parts["A"], parts["B"])
    return pairs


def to_diffusers_state_dict(
    peft_state_dict: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """`transformer.blocks.N.<module>.lora_A.weight` / `.lora_B.weight` (B scaled by peft's alpha / r),
    the layout `WanImageToVideoPipeline.load_lora_weights` loads as is (`save_lora_weights` writes it)."""
    converted: dict[str, torch.Tensor] = {}
    for module, (_, down, up) in _lora_pairs(peft_state_dict).items():
        scale = lora_scale(down.shape[0], adapter_config)
        converted[f"transformer.{module}.lora_A.weight"] = down.contiguous()
        converted[f"transformer.{module}.lora_B.weight"] = (up * scale if scale != 1.0 else up).contiguous()
    return converted


def to_comfyui_state_dict(
    peft_state_dict: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """`diffusion_model.blocks.N.<original>.lora_down.weight` / `.lora_up.weight` / `.alpha`, ComfyUI's Wan
    LoRA key names; `.alpha` = scale * rank so ComfyUI's alpha / rank is peft's scale exactly."""
    converted: dict[str, torch.Tensor] = {}
    for module, (block, down, up) in _lora_pairs(peft_state_dict).items():
        rank = down.shape[0]
        relative = module.split(".", 2)[2]
        prefix = f"diffusion_model.blocks.{block}.{COMFYUI_MODULES[relative]}"
        converted[f"{prefix}.lora_down.weight"] = down.contiguous()
        converted[f"{prefix}.lora_up.weight"] = up.contiguous()
        converted[f"{prefix}.alpha"] = torch.tensor(
            lora_scale(rank, adapter_config) * rank, dtype=torch.float32
        )
    return converted
