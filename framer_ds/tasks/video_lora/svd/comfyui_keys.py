"""A peft LoRA on diffusers' SVD UNet -> ComfyUI's generic LoRA format.

ComfyUI holds SVD in Stability's original layout (generative-models `VideoUNet`) and its LoRA loader
(`comfy/lora.py`, `model_lora_keys_unet`) accepts, for every weight `diffusion_model.<path>.weight` of
that model, the "generic" key `diffusion_model.<path>` with the tensors `.lora_up.weight` [out, r],
`.lora_down.weight` [r, in] and an optional `.alpha`; it adds `alpha / r * up @ down` to the weight.

The diffusers -> original module map is the inverse of diffusers' own
`scripts/convert_svd_to_diffusers.py` (original -> diffusers):
- `input_blocks.{i}.1`  <- `down_blocks.{(i-1) // (L+1)}.attentions.{(i-1) % (L+1)}` (L = layers_per_block)
- `middle_block.1`      <- `mid_block.attentions.0`
- `output_blocks.{i}.1` <- `up_blocks.{i // (L+1)}.attentions.{i % (L+1)}`
- inside a block, `time_stack` <- `temporal_transformer_blocks` and `time_pos_embed.0/.2` <-
  `time_pos_embed.linear_1/linear_2`; `transformer_blocks.N.attn1.to_q`, `ff.net.0.proj`, `ff_in.*`,
  `proj_in`, `proj_out`, `norm` keep their names (SVD's transformers are linear, as diffusers').
LoRA targets are inside these transformer blocks (attention, feed-forward, projections); a module
outside them (a resnet, conv_in) has no entry here and is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from framer_ds.tasks.video_lora.shared.comfyui_lora import lora_scale, refusal

PEFT_PREFIX = "base_model.model."
_DOWN = re.compile(r"^down_blocks\.(\d+)\.attentions\.(\d+)\.(.+)$")
_UP = re.compile(r"^up_blocks\.(\d+)\.attentions\.(\d+)\.(.+)$")
_MID = re.compile(r"^mid_block\.attentions\.0\.(.+)$")
_INSIDE = (
    ("temporal_transformer_blocks.", "time_stack."),
    ("time_pos_embed.linear_1", "time_pos_embed.0"),
    ("time_pos_embed.linear_2", "time_pos_embed.2"),
)


def uniform_layers_per_block(unet_config: dict[str, Any]) -> int:
    """SVD's `layers_per_block` (2); the original layout's block numbering assumes one value."""
    value = unet_config.get("layers_per_block", 2)
    if isinstance(value, list | tuple):
        if len(set(value)) != 1:
            raise ValueError(f"layers_per_block {value} differs per block; the original SVD layout has one")
        value = value[0]
    return int(value)


def _inside(rest: str) -> str:
    for diffusers_name, original_name in _INSIDE:
        rest = rest.replace(diffusers_name, original_name)
    return rest


def original_svd_module(diffusers_module: str, layers_per_block: int) -> str:
    """`down_blocks.0.attentions.1.temporal_transformer_blocks.0.attn1.to_q` ->
    `input_blocks.2.1.time_stack.0.attn1.to_q`; ValueError for a module outside the transformers."""
    per_block = layers_per_block + 1
    if match := _DOWN.match(diffusers_module):
        block, layer, rest = int(match[1]), int(match[2]), match[3]
        return f"input_blocks.{block * per_block + layer + 1}.1.{_inside(rest)}"
    if match := _UP.match(diffusers_module):
        block, layer, rest = int(match[1]), int(match[2]), match[3]
        return f"output_blocks.{block * per_block + layer}.1.{_inside(rest)}"
    if match := _MID.match(diffusers_module):
        return f"middle_block.1.{_inside(match[1])}"
    raise ValueError(f"{diffusers_module} is outside SVD's transformer blocks; no ComfyUI key maps it")


def comfyui_lora_state_dict(
    adapter: dict[str, torch.Tensor], adapter_config: dict[str, Any], unet_config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """peft's saved adapter tensors -> `diffusion_model.<original>.lora_up.weight/.lora_down.weight/.alpha`.

    `.alpha` is written so that ComfyUI's `alpha / rank` equals peft's scaling exactly (alpha / r, or
    alpha / sqrt(r) with rsLoRA), whatever alpha and rank were."""
    layers_per_block = uniform_layers_per_block(unet_config)
    converted: dict[str, torch.Tensor] = {}
    for key in sorted(adapter):
        if not key.startswith(PEFT_PREFIX):
            raise refusal(f"unexpected key {key!r} in the adapter")
        name = key[len(PEFT_PREFIX) :]
        if name.endswith(".lora_B.weight"):
            continue  # taken with its lora_A
        if not name.endswith(".lora_A.weight"):
            raise refusal(f"{name} is not a LoRA matrix (a fully trained module such as a widened conv_in)")
        module = name[: -len(".lora_A.weight")]
        down, up = adapter[key], adapter[f"{PEFT_PREFIX}{module}.lora_B.weight"]
        if down.dim() != 2:
            raise refusal(f"{module} is a convolution LoRA; this exporter maps linear layers only")
        try:
            original = original_svd_module(module, layers_per_block)
        except ValueError as exc:
            raise refusal(str(exc)) from None
        rank = down.shape[0]
        scale = lora_scale(rank, adapter_config)
        prefix = f"diffusion_model.{original}"
        converted[f"{prefix}.lora_down.weight"] = down
        converted[f"{prefix}.lora_up.weight"] = up
        converted[f"{prefix}.alpha"] = torch.tensor(scale * rank, dtype=torch.float32)
    if not converted:
        raise refusal("it holds no LoRA matrices")
    return converted
