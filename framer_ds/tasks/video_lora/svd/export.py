"""Using a video_lora adapter outside training: `framer-ds sample` (base SVD + adapter -> an mp4) and
`framer-ds export --format merged` (a diffusers directory with the LoRA merged in).

Both read the adapter's metadata (`framer_ds_video_lora.json`: mode, size, the fps and motion bucket
training conditioned on), so a sample conditions as training did without the user repeating it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export_out import check_export_directory, export_directory
from framer_ds.tasks.video_lora.shared.comfyui_lora import export_comfyui_lora
from framer_ds.tasks.video_lora.shared.exports import (
    EXPORT_METADATA,
    ExportFormat,
    VideoExportCommandOptions,
    export_peft,
    load_frame,
    read_adapter_metadata,
    refuse_foreign_flags,
    require_last_image,
    trained_fps_metadata,
)
from framer_ds.tasks.video_lora.svd.comfyui_keys import comfyui_lora_state_dict
from framer_ds.tasks.video_lora.svd.options import SvdSampleFlags, TemporalContextOrder, default_order
from framer_ds.tasks.video_lora.svd.temporal_context import set_temporal_context_order
from framer_ds.tasks.video_lora.svd.unet import widen_conv_in

COMFYUI_FILE = "svd_lora_comfyui.safetensors"
DEFAULT_FPS = 7  # SVD's pipeline default, for adapters trained before the fps was recorded


def export_metadata(
    config: Any, svd_dir: Path, trained_fps: list[float], motion_buckets: Any, conv_in_extra: int
) -> dict[str, Any]:
    """What a sampler needs besides the adapter: the base, the mode, the frame shape and the conditioning
    values training used (fps, motion bucket, and with `from_data` the score quantiles). `conv_in_extra`:
    the input channels training added to SVD's conv_in (`SvdFamily.conv_in_extra_channels`)."""
    options, data = config.model, config.data
    return {
        "base_model": str(svd_dir),
        "mode": options.base.mode,
        "conv_in_extra_channels": conv_in_extra,
        "num_frames": data.num_frames,
        "height": data.height,
        "width": data.width,
        **trained_fps_metadata(options.fps, trained_fps),
        "motion_bucket_id": options.fixed_motion_bucket,
        "motion_bucket": options.motion_bucket,
        "temporal_context_order": options.context_order,
        **({"motion_score_quantiles": motion_buckets.summary()} if motion_buckets is not None else {}),
    }


def export_context_order(metadata: dict[str, Any]) -> TemporalContextOrder:
    """The temporal context order an export was trained with (its metadata; exports written before the
    key existed trained with their base's own order)."""
    return metadata.get("temporal_context_order") or default_order(metadata.get("base", "svd"))


def load_pipeline_with_adapter(adapter_dir: Path, device: str, dtype: torch.dtype, base: Path | None = None):
    """StableVideoDiffusionPipeline whose UNet has the adapter merged (conv_in widened first for an
    interpolation adapter, exactly as in training). The VAE runs in the dtype training encoded with
    (fp32 where SVD's VAE would overflow in fp16: `svd/conditioning.vae_dtype`)."""
    from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline
    from peft import PeftModel

    from framer_ds.tasks.video_lora.svd.conditioning import vae_dtype
    from framer_ds.tasks.video_lora.svd.tiny import load_svd_components

    metadata = read_adapter_metadata(adapter_dir)
    if metadata.get("base") == "framer":  # its UNet is Framer's (9 channels, mask_token), not SVD's
        raise ConfigError(
            [
                ConfigProblem(
                    str(adapter_dir),
                    "was trained on a Framer base (model.base.name framer): it loads into Framer's UNet and "
                    "pipeline, not into stock SVD's; use `framer-ds sample` / `framer-ds export` (they "
                    "route it there), or framer_ds.tasks.video_lora.framer.sampling.framer_sampler_parts",
                )
            ],
            "loading the adapter",
        )
    base = Path(base or metadata["base_model"])
    unet, vae, image_encoder, feature_extractor = load_svd_components(base, dtype=dtype)
    if metadata["conv_in_extra_channels"]:
        widen_conv_in(unet, metadata["conv_in_extra_channels"])
    unet = PeftModel.from_pretrained(unet, adapter_dir).merge_and_unload()
    set_temporal_context_order(unet, export_context_order(metadata))
    scheduler = EulerDiscreteScheduler.from_pretrained(base, subfolder="scheduler")
    pipe = StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=scheduler,
        feature_extractor=feature_extractor,
    ).to(device)
    pipe.vae.to(dtype=vae_dtype(pipe.vae.config, dtype))
    return pipe, metadata


def require_flags_fit_adapter(
    metadata: dict[str, Any], options: Any, own: tuple[type, ...] = (SvdSampleFlags,)
) -> None:
    """ConfigError when a flag does not fit the export: --last-image for its mode, another family's
    flags (`own`: the family's flag groups; Framer's adds its tracks and ControlNet flags)."""
    require_last_image(metadata, options)
    refuse_foreign_flags(options, metadata.get("base", "svd"), own)


def svd_sampler_parts(
    adapter_dir: Path,
    metadata: dict[str, Any],
    options: Any,
    num_frames: int,
    device: str,
    dtype: torch.dtype,
):
    """(SamplerParts, None) of an SVD export: stock SVD's pipeline with the adapter merged (a Framer
    export is refused there: its family samples it, `FramerFamily.sampler_parts`)."""
    from framer_ds.tasks.video_lora.svd.sampling import SamplerParts

    pipe, _ = load_pipeline_with_adapter(adapter_dir, device, dtype)
    return SamplerParts.from_pipeline(pipe), None


def no_record_fields(metadata: dict[str, Any], options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stock SVD's `SvdFamily.sample_record_fields`: nothing beyond the shared settings."""
    return {}, {}


def sample_to_file(
    adapter_dir: Path,
    options: Any,
    sampler_parts: Callable[..., Any] = svd_sampler_parts,
    own_flags: tuple[type, ...] = (SvdSampleFlags,),
    record_fields: Callable[[dict[str, Any], Any], tuple[dict[str, Any], dict[str, Any]]] = no_record_fields,
) -> str:
    """Write one video from the adapter in `adapter_dir` (plus its frames as PNGs and `<stem>.json`, the
    seed and every conditioning value: `sample_record.py`); prints those values before the denoising
    starts and returns the closing line. `sampler_parts`: the family's (`SvdFamily.sampler_parts`:
    (SamplerParts, its SamplingConditioning or None) of the export); `own_flags`: its flag groups;
    `record_fields`: its own (settings, base folders) for the record (`SvdFamily.sample_record_fields`)."""
    from framer_ds.data.progress import sampling_progress
    from framer_ds.tasks.video_lora.shared.data.video_write import to_uint8_frames
    from framer_ds.tasks.video_lora.shared.sample_record import describe, sample_record, write_sample_outputs
    from framer_ds.tasks.video_lora.shared.sample_shape import sample_shape
    from framer_ds.tasks.video_lora.svd.motion import motion_bucket_choice
    from framer_ds.tasks.video_lora.svd.sampling import sample_video

    device = options.resolved_device()
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    metadata = read_adapter_metadata(adapter_dir)
    require_flags_fit_adapter(metadata, options, own_flags)
    height, width, num_frames = sample_shape(metadata, options.height, options.width, options.num_frames)
    metadata = {**metadata, "height": height, "width": width}  # what the rest samples at (sample_shape.py)
    size = (height, width)
    first = load_frame(options.image, *size, device, options.resize)
    last = load_frame(options.last_image, *size, device, options.resize) if options.last_image else None
    fps = options.fps or metadata.get("fps") or DEFAULT_FPS
    motion = motion_bucket_choice(options.motion_bucket, metadata, first, last, num_frames)
    parts, conditioning = sampler_parts(adapter_dir, metadata, options, num_frames, device, dtype)
    settings = {"num_frames": num_frames, "height": size[0], "width": size[1], "fps": fps, **motion}
    if conditioning is not None:
        settings.update(conditioning.record())
    own_settings, base_fields = record_fields(metadata, options)
    settings = {
        **settings,
        "device": device,
        "dtype": str(dtype),
        "noise_aug_strength": options.noise_aug,
        "steps": options.steps,
        "min_guidance": options.min_guidance,
        "max_guidance": options.max_guidance,
        "guidance_schedule": options.guidance_schedule,
        "decode_chunk_size": options.decode_chunk_size,
        **own_settings,
    }
    record = sample_record(adapter_dir, metadata, options, settings, base_fields)
    print(describe(record), flush=True)
    with sampling_progress(options.steps, "sample") as bar:
        frames = sample_video(
            parts,
            first,
            last,
            num_frames,
            fps,
            motion["motion_bucket"],
            noise_aug_strength=options.noise_aug,
            num_inference_steps=options.steps,
            min_guidance_scale=options.min_guidance,
            max_guidance_scale=options.max_guidance,
            generator=torch.Generator(device=device).manual_seed(options.seed),
            decode_chunk_size=options.decode_chunk_size,
            conditioning=conditioning,
            guidance_schedule=options.guidance_schedule,
            on_step=bar.update,
        )
    pixels = to_uint8_frames(frames)
    written = write_sample_outputs(options.out, pixels, fps, record, options.frames)
    return (
        f"wrote {options.out} ({written.codec_name}): {len(pixels)} frames at {size[1]}x{size[0]}, "
        f"conditioned on {fps:g} fps, motion bucket {motion['motion_bucket']}, seed "
        f"{options.seed}{written.files_note()}"
    )


def export_merged(
    adapter_dir: Path, out: Path, dtype_name: str, base: Path | None = None, overwrite: bool = False
) -> str:
    """`--format merged`: an image-to-video adapter -> a full StableVideoDiffusionPipeline directory; an
    interpolation one -> the merged UNet only (the stock pipeline cannot feed its first+last-frame
    conditioning). A directory format: `out` must be new or empty (engine/export_out.py)."""
    out = Path(out)
    check_export_directory(out, overwrite)  # before minutes of loading and merging
    dtype = getattr(torch, dtype_name)
    pipe, metadata = load_pipeline_with_adapter(adapter_dir, "cpu", dtype, base)
    with export_directory(out) as staging:
        if metadata["mode"] == "interpolation":
            pipe.unet.save_pretrained(staging, safe_serialization=True)
            loader = "UNetSpatioTemporalConditionModel.from_pretrained"
            what = "the merged UNet (9 input channels, which the stock pipeline cannot feed)"
        else:
            pipe.vae.to(dtype=dtype)
            pipe.save_pretrained(staging, safe_serialization=True)
            loader = "StableVideoDiffusionPipeline.from_pretrained"
            what = "a full Stable Video Diffusion pipeline with the LoRA merged"
        (staging / EXPORT_METADATA).write_text(json.dumps({**metadata, "merged": True}, indent=2))
    return f"wrote {out}: {what}; load it with {loader}({str(out)!r})"


def export_merged_format(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    return export_merged(adapter_dir, options.out, options.dtype, options.base, options.overwrite)


def refuse_framer_format(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """`--format framer` of an SVD run: its UNet is not Framer's."""
    problem = ConfigProblem(
        "--format",
        f"{adapter_dir} was trained on stock SVD (model.base.name svd), whose UNet has no mask_token and "
        "another conditioning convention; --format framer needs a model.base.name framer run. Use "
        "--format merged.",
    )
    raise ConfigError([problem], "export")


def export_comfyui(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """One safetensors file ComfyUI's LoraLoader reads for SVD image-to-video: `diffusion_model.<original
    SVD module>.lora_up.weight / .lora_down.weight / .alpha`. Refused for an interpolation adapter: its
    UNet takes a mask channel (9 inputs) that ComfyUI's 8-channel SVD model has no place for."""
    metadata = read_adapter_metadata(adapter_dir)
    if metadata.get("conv_in_extra_channels") or metadata.get("mode") == "interpolation":
        problem = ConfigProblem(
            "--format",
            "comfyui cannot load this adapter: it is a first/last-frame interpolation model whose conv_in "
            f"takes {8 + int(metadata.get('conv_in_extra_channels') or 1)} input channels (latents, "
            "conditioning, mask), and ComfyUI's SVD image-to-video model has 8; a LoRA cannot add input "
            "channels. Use --format merged (a diffusers UNet) or --format framer.",
        )
        raise ConfigError([problem], "export")
    base = Path(options.base or metadata["base_model"])
    unet_config = json.loads((base / "unet" / "config.json").read_text())
    path, converted = export_comfyui_lora(
        adapter_dir,
        metadata,
        options,
        COMFYUI_FILE,
        lambda tensors, config: comfyui_lora_state_dict(tensors, config, unet_config),
    )
    modules = sum(k.endswith(".alpha") for k in converted)
    return (
        f"wrote {path}: {modules} LoRA modules in ComfyUI's format (put it in, "
        "or export straight to, ComfyUI/models/loras) and apply it with LoraLoaderModelOnly to an SVD "
        "image-to-video model"
    )


SVD_EXPORT_FORMATS: dict[str, ExportFormat] = {
    "peft": export_peft,
    "merged": export_merged_format,
    "comfyui": export_comfyui,
    "framer": refuse_framer_format,
}
