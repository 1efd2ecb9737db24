"""LoRA on the SVD UNet with peft, and the extra mask channel for first/last-frame interpolation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from framer_ds.engine.pretrained import load_pretrained
from framer_ds.tasks.video_lora.config import LoraOptions, VideoLoraModelConfig

if TYPE_CHECKING:
    from peft import PeftModel

MASK_CHANNELS = 1


def widen_conv_in(unet: torch.nn.Module, extra_channels: int = MASK_CHANNELS) -> torch.nn.Module:
    """Give `conv_in` extra input channels (the interpolation mask) with ZERO weights.

    Zero weights make the widened UNet compute exactly what the pretrained one did at step 0, so
    fine-tuning starts from SVD's behaviour; the new weights are trained with the LoRA (peft
    `modules_to_save`) and saved in the adapter. A plain diffusers script calls this same function
    before loading the adapter.
    """
    old = unet.conv_in
    new = torch.nn.Conv2d(
        old.in_channels + extra_channels,
        old.out_channels,
        kernel_size=old.kernel_size,
        stride=old.stride,
        padding=old.padding,
        dtype=old.weight.dtype,
        device=old.weight.device,
    )
    with torch.no_grad():
        new.weight.zero_()
        new.weight[:, : old.in_channels] = old.weight
        new.bias.copy_(old.bias)
    unet.conv_in = new
    unet.register_to_config(in_channels=new.in_channels)
    return unet


def apply_lora(unet: torch.nn.Module, options: LoraOptions, train_conv_in: bool) -> PeftModel:
    """Freeze the UNet and add LoRA adapters (peft); only LoRA (and conv_in when widened) train. peft is
    imported here, not with the module: `framer-ds validate` and a cached `plan` import the task
    without building a model (peft brings transformers, seconds of CPU)."""
    from peft import LoraConfig, get_peft_model

    unet.requires_grad_(False)
    config = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=options.targets(),
        init_lora_weights=options.peft_init(),
        modules_to_save=["conv_in"] if train_conv_in else None,
    )
    return get_peft_model(unet, config)


def build_svd_lora_unet(
    svd_path, model: VideoLoraModelConfig, gradient_checkpointing: bool
) -> tuple[torch.nn.Module, PeftModel]:
    """(the bare SVD UNet, the peft model training it): loaded from `svd_path`, conv_in widened for
    interpolation before the LoRA goes on, gradient checkpointing as configured. The Framer base has
    its own builder (framer_setup.py)."""
    from diffusers import UNetSpatioTemporalConditionModel

    unet = load_pretrained(UNetSpatioTemporalConditionModel, svd_path, subfolder="unet")
    interpolation = model.base.mode == "interpolation"
    if interpolation:
        widen_conv_in(unet)
    if gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    return unet, apply_lora(unet, model.lora, train_conv_in=interpolation)
