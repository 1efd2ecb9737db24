"""`framer-ds sample` for a `model.base.name: framer` export: Framer's UNet (with the LoRA merged) and
ControlNet from the export and its base Framer directory, VAE, CLIP and scheduler from the SVD directory,
sampled with Framer's conditioning (`framer_conditioning.FramerSampling`). The ControlNet runs on the
heatmaps of `--tracks` (`sample_tracks.tracks_conditioning`, `framer_sampler_parts_for`); without
tracks it is skipped, as Framer's pipeline does without points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from framer_ds.tasks.video_lora.framer.export import CONTROLNET_DIR


def framer_sampler_parts(adapter_dir: Path, metadata: dict[str, Any], device: str, dtype: torch.dtype):
    """(SamplerParts with a FramerModel as the denoiser, FramerSampling) for the export in `adapter_dir`."""
    from diffusers import AutoencoderKLTemporalDecoder, EulerDiscreteScheduler
    from transformers import CLIPVisionModelWithProjection

    from framer_ds.tasks.video_lora.framer.conditioning import FramerSampling
    from framer_ds.tasks.video_lora.framer.export import merged_framer_unet
    from framer_ds.tasks.video_lora.framer.model import FramerModel, load_framer_controlnet
    from framer_ds.tasks.video_lora.svd.conditioning import vae_dtype
    from framer_ds.tasks.video_lora.svd.export import export_context_order
    from framer_ds.tasks.video_lora.svd.sampling import SamplerParts
    from framer_ds.tasks.video_lora.svd.temporal_context import set_temporal_context_order

    base, svd = Path(metadata["framer_path"]), Path(metadata["base_model"])
    unet = merged_framer_unet(adapter_dir, metadata, base, torch.float32)  # + a trained mask_token
    trained = Path(adapter_dir) / CONTROLNET_DIR
    controlnet = load_framer_controlnet(trained if metadata.get("has_controlnet") else base / "controlnet")
    model = FramerModel(unet, controlnet, unet.mask_token).to(device, dtype).eval()
    set_temporal_context_order(model, export_context_order(metadata))  # as it trained: Framer's layout
    vae = AutoencoderKLTemporalDecoder.from_pretrained(svd, subfolder="vae").to(device)
    vae.to(dtype=vae_dtype(vae.config, dtype))
    encoder = CLIPVisionModelWithProjection.from_pretrained(svd, subfolder="image_encoder", dtype=dtype)
    scheduler = EulerDiscreteScheduler.from_pretrained(svd, subfolder="scheduler")
    parts = SamplerParts(model, unet, vae, encoder.to(device).eval(), scheduler)
    framer = FramerSampling(
        unet.mask_token.detach(),
        None,
        metadata.get("controlnet_cond_scale", 1.0),
        tuple(metadata.get("controlnet_step_range", (0.0, 1.0))),
    )
    return parts, framer


def framer_sampler_parts_for(
    adapter_dir: Path,
    metadata: dict[str, Any],
    options: Any,
    num_frames: int,
    device: str,
    dtype: torch.dtype,
):
    """(SamplerParts, FramerSampling) for `framer-ds sample` of a Framer export, with the flags' tracks and
    ControlNet settings (the tracks file is read before any model loads)."""
    from PIL import Image

    from framer_ds.tasks.video_lora.framer.tracks.sample_tracks import tracks_conditioning

    heatmaps = None  # the tracks file is checked before any model loads
    if options.tracks is not None:
        with Image.open(options.image) as image:
            image_size = image.size
        size = (metadata["height"], metadata["width"])
        heatmaps = tracks_conditioning(options.tracks, image_size, num_frames, *size, options.resize, dtype)
    parts, framer = framer_sampler_parts(adapter_dir, metadata, device, dtype)
    framer.controlnet_cond = heatmaps
    if options.controlnet_scale is not None:
        framer.conditioning_scale = options.controlnet_scale
    if options.controlnet_step_range is not None:
        framer.step_range = options.controlnet_step_range
    return parts, framer
