"""`framer-ds sample` for video_lora: base SVD + a framer_ds LoRA adapter -> an mp4."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pydantic import Field

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.tasks.base import SampleCommandOptions
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in

EXPORT_METADATA = "framer_ds_video_lora.json"


class VideoSampleCommandOptions(SampleCommandOptions):
    """`framer-ds sample RUN/final --image first.png [--last-image last.png] --out video.mp4`."""

    image: Path = Field(description="The first frame (resized to the trained size).")
    last_image: Path | None = Field(None, description="The last frame: required by interpolation adapters.")
    out: Path = Field(description="The .mp4 to write.")
    steps: int = Field(25, ge=1, description="Euler sampling steps.")
    seed: int = Field(0, description="Seeds the sampling noise.")
    fps: float | None = Field(
        None, gt=0, description="fps conditioning and output rate; default: the trained value, else 7."
    )


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


def sample_to_file(adapter_dir: Path, options: VideoSampleCommandOptions) -> str:
    """Write one video from the adapter in `adapter_dir`; returns the line to print."""
    from framer_ds.data.video_write import to_uint8_frames, write_video
    from framer_ds.diffusion.sampling import SamplerParts, sample_video

    device = options.resolved_device()
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    pipe, meta = load_pipeline_with_adapter(adapter_dir, device, dtype)
    if (meta["mode"] == "interpolation") != (options.last_image is not None):
        need = "required" if meta["mode"] == "interpolation" else "not used"
        problem = ConfigProblem("--last-image", f"this is a {meta['mode']} adapter: --last-image is {need}")
        raise ConfigError([problem], "sample")
    size = (meta["height"], meta["width"])
    first = load_frame(options.image, *size, device)
    last = load_frame(options.last_image, *size, device) if options.last_image else None
    fps = options.fps or meta.get("fps") or 7
    frames = sample_video(
        SamplerParts.from_pipeline(pipe),
        first,
        last,
        meta["num_frames"],
        fps,
        meta["motion_bucket_id"],
        num_inference_steps=options.steps,
        generator=torch.Generator(device=device).manual_seed(options.seed),
    )
    pixels = to_uint8_frames(frames)
    write_video(options.out, pixels, fps)
    return f"wrote {options.out}: {len(pixels)} frames at {size[1]}x{size[0]}, {fps} fps"
