"""Load base SVD + a framer_ds LoRA adapter for sampling (what `framer-ds sample` does)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.tasks.video_lora.task import EXPORT_METADATA
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in


def read_adapter_metadata(adapter_dir: Path) -> dict:
    path = Path(adapter_dir) / EXPORT_METADATA
    if not path.is_file():
        raise ConfigError(
            [
                ConfigProblem(
                    str(adapter_dir),
                    f"no {EXPORT_METADATA}: pass a video_lora run's final/ or "
                    "checkpoints/step_N/adapter/ directory",
                )
            ]
        )
    return json.loads(path.read_text())


def load_pipeline_with_adapter(adapter_dir: Path, device: str, dtype: torch.dtype):
    """StableVideoDiffusionPipeline whose UNet has the adapter merged (conv_in widened first for an
    interpolation adapter, exactly as in training)."""
    from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline
    from peft import PeftModel

    from framer_ds.diffusion.tiny_svd import load_svd_components

    metadata = read_adapter_metadata(adapter_dir)
    unet, vae, image_encoder, feature_extractor = load_svd_components(metadata["base_model"], dtype=dtype)
    if metadata["conv_in_extra_channels"]:
        widen_conv_in(unet, metadata["conv_in_extra_channels"])
    unet = PeftModel.from_pretrained(unet, adapter_dir).merge_and_unload()
    scheduler = EulerDiscreteScheduler.from_pretrained(metadata["base_model"], subfolder="scheduler")
    pipe = StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=scheduler,
        feature_extractor=feature_extractor,
    )
    return pipe.to(device), metadata


def load_frame(path: Path, height: int, width: int, device: str) -> torch.Tensor:
    """An image file -> [3,H,W] in [-1,1] (resized with antialiasing to the trained size)."""
    image = Image.open(path).convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    array = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 127.5 - 1.0
    return array.to(device)
