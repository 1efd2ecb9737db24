"""Using a video_lora adapter outside training: `framer-ds sample` (base SVD + adapter -> an mp4) and
`framer-ds export --format merged` (a diffusers directory with the LoRA merged in).

Both read the adapter's metadata (`framer_ds_video_lora.json`: mode, size, the fps and motion bucket
training conditioned on), so a sample conditions as training did without the user repeating it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pydantic import Field, field_validator

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError
from framer_ds.engine.export import read_export_json
from framer_ds.engine.export_out import check_export_directory, export_directory
from framer_ds.tasks.base import SampleCommandOptions
from framer_ds.tasks.video_lora.bases import StepRange
from framer_ds.tasks.video_lora.config import GuidanceScheduleName
from framer_ds.tasks.video_lora.data.video_clips import resize_and_crop
from framer_ds.tasks.video_lora.diffusion.temporal_context import (
    TemporalContextOrder,
    default_order,
    set_temporal_context_order,
)
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in

EXPORT_METADATA = "framer_ds_video_lora.json"
DEFAULT_FPS = 7  # SVD's pipeline default, for adapters trained before the fps was recorded


class VideoSampleCommandOptions(SampleCommandOptions):
    """`framer-ds sample RUN/final --image first.png [--last-image last.png] --out video.mp4`; every
    conditioning value defaults to what training used (the adapter's metadata)."""

    image: Path = Field(description="The first frame.")
    last_image: Path | None = Field(None, description="The last frame: required by interpolation adapters.")
    out: Path = Field(description="The .mp4 to write.")
    resize: Literal["crop", "stretch", "pad"] = Field(
        "crop",
        description="How a frame of another shape becomes the trained size: 'crop' scales to cover and "
        "centre-crops (as the training loader does), 'stretch' ignores the aspect ratio, 'pad' fits "
        "inside and pads with black.",
    )
    steps: int = Field(
        25,
        ge=1,
        description="Euler sampling steps.",
        json_schema_extra={"old_flags": ["--num-inference-steps"]},
    )
    prompt: str | None = Field(None, description="Wan exports: the text prompt (required there).")
    negative_prompt: str | None = Field(
        None, description="Wan exports: the negative prompt; default: the diffusers pipeline's."
    )
    guidance_scale: float | None = Field(
        None, ge=0, description="Wan exports: classifier-free guidance; default: the diffusers pipeline's."
    )
    guidance_scale_2: float | None = Field(
        None,
        ge=0,
        description="Wan 2.2 exports: guidance of the low-noise expert's steps; default: the diffusers "
        "pipeline's (= --guidance-scale).",
    )
    other_expert: Path | None = Field(
        None,
        description="Wan 2.2 exports: the final/ of a run that trained the OTHER expert of the same base; "
        "its adapter goes on that expert (without it, that expert samples as the base).",
    )
    save_frames: Path | None = Field(
        None,
        description="Wan exports: also save the float frames in [0, 1] the mp4 encodes, as a .npy of "
        "[frames, height, width, 3].",
    )
    seed: int = Field(0, description="Seeds the sampling noise.")
    fps: float | None = Field(
        None, gt=0, description="fps conditioning and output rate; default: the trained fps."
    )
    motion_bucket: int | Literal["auto"] | None = Field(
        None,
        description="SVD's motion conditioning, 0..255, or 'auto': estimated from the first and last "
        "frames with the motion score training used (a run trained with model.motion_bucket: from_data, "
        "whose export records the score quantiles). Default: auto for such a run, else the trained value.",
        json_schema_extra={"old_flags": ["--motion-bucket-id"]},
    )
    noise_aug: float = Field(
        0.02, ge=0, description="Noise added to the conditioning frames (SVD's noise_aug_strength)."
    )
    min_guidance: float = Field(
        1.0, ge=0, description="Classifier-free guidance at the first frame (both ends with middle_max)."
    )
    max_guidance: float = Field(
        3.0, ge=0, description="Classifier-free guidance at the last frame (the middle with middle_max)."
    )
    num_frames: int | None = Field(None, ge=2, description="Frames to generate; default: the trained count.")
    height: int | None = Field(
        None,
        ge=1,
        description="Frame height: a shape the export trained at (data.buckets); default: trained.",
    )
    width: int | None = Field(
        None, ge=1, description="Frame width: a shape the export trained at (data.buckets); default: trained."
    )
    decode_chunk_size: int = Field(8, ge=1, description="Frames per VAE decode call (memory).")
    frames: bool = Field(
        True,
        description="Also write each frame as a PNG in <out stem>_frames/ (lossless, for frame-by-frame "
        "comparison); --no-frames skips them (they take many times the mp4's space at large sizes).",
    )
    guidance_schedule: GuidanceScheduleName = Field(
        "linear",
        description="Guidance over the frames: 'linear' ramps min -> max from first to last frame (SVD); "
        "'middle_max' is Framer's middle_max_guidance: lowest at both ends, highest in the middle.",
    )
    tracks: Path | None = Field(
        None,
        description="Framer exports: a JSON file of point trajectories for the ControlNet, "
        '{"points": [[[x, y], ...per frame or keyframe...], ...per point...], "size": [W, H], '
        '"visible": [[true, ...], ...]} (size and visible optional) or Framer\'s demo drag list '
        "(docs/video_lora.md, Framer). Without it the ControlNet does not run.",
    )
    controlnet_scale: float | None = Field(
        None,
        ge=0,
        description="Framer exports: scale of the ControlNet residuals (Framer's controlnet_cond_scale); "
        "default: the export's model.base.controlnet_cond_scale.",
    )
    controlnet_step_range: StepRange | None = Field(
        None,
        description="Framer exports: the fractions of the sampling steps (LO HI, 0 <= LO <= HI <= 1) where "
        "the ControlNet runs (Framer's controlnet_step_range); default: the export's "
        "model.base.controlnet_step_range.",
    )

    @field_validator("motion_bucket")
    @classmethod
    def _bucket_range(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 0 <= value <= 255:
            raise ValueError(f"a motion bucket is 0..255 (or auto), got {value}")
        return value


def read_adapter_metadata(adapter_dir: Path) -> dict[str, Any]:
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
    return read_export_json(path)


def trained_fps_metadata(config_fps: float | None, trained: list[float]) -> dict[str, Any]:
    """What the adapter records about fps: the configured value, or the median (and range) of the fps
    values training conditioned on when `model.fps` was null (each clip's source fps / stride)."""
    if config_fps is not None:
        return {"fps": config_fps, "fps_source": "model.fps"}
    if not trained:
        return {"fps": None, "fps_source": "unknown"}
    return {
        "fps": statistics.median(trained),
        "fps_range": [min(trained), max(trained)],
        "fps_source": "median of the training clips' fps (source fps / stride)",
    }


def export_metadata(
    config: Any, svd_dir: Path, trained_fps: list[float], motion_buckets: Any
) -> dict[str, Any]:
    """What a sampler needs besides the adapter: the base, the mode, the frame shape and the conditioning
    values training used (fps, motion bucket, and with `from_data` the score quantiles)."""
    options, data = config.model, config.data
    return {
        "base_model": str(svd_dir),
        "mode": options.base.mode,
        "conv_in_extra_channels": int(options.base.mode == "interpolation" and options.base.name == "svd"),
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
    (fp32 where SVD's VAE would overflow in fp16: `svd_conditioning.vae_dtype`)."""
    from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline
    from peft import PeftModel

    from framer_ds.tasks.video_lora.diffusion.svd_conditioning import vae_dtype
    from framer_ds.tasks.video_lora.models.tiny_svd import load_svd_components

    metadata = read_adapter_metadata(adapter_dir)
    if metadata.get("base") == "framer":  # its UNet is Framer's (9 channels, mask_token), not SVD's
        raise ConfigError(
            [
                ConfigProblem(
                    str(adapter_dir),
                    "was trained on a Framer base (model.base.name framer): it loads into Framer's UNet and "
                    "pipeline, not into stock SVD's; use `framer-ds sample` / `framer-ds export` (they "
                    "route it there), or framer_ds.tasks.video_lora.framer_inference.framer_sampler_parts",
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


def load_frame(path: Path, height: int, width: int, device: str, resize: str = "crop") -> torch.Tensor:
    """An image file -> [3,H,W] in [-1,1] at the trained size; 'crop' is the training loader's own
    resize-and-centre-crop, so a sample starts from a frame framed as the training clips were."""
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB")).copy()
    except (OSError, ValueError) as exc:
        raise InputDataError(f"cannot read the image {path} ({type(exc).__name__}: {exc})") from exc
    frames = torch.from_numpy(pixels)[None]  # [1,H,W,3] uint8
    if resize == "crop":
        out = resize_and_crop(frames, height, width, random_crop=False)[0]
    else:
        chw = frames.permute(0, 3, 1, 2).float() / 255.0
        if resize == "stretch":
            out = F.interpolate(chw, size=(height, width), mode="bilinear", antialias=True)[0]
        else:  # pad: fit inside, black borders
            scale = min(height / chw.shape[-2], width / chw.shape[-1])
            size = (max(1, round(chw.shape[-2] * scale)), max(1, round(chw.shape[-1] * scale)))
            inner = F.interpolate(chw, size=size, mode="bilinear", antialias=True)[0]
            out = torch.zeros(3, height, width)
            top, left = (height - size[0]) // 2, (width - size[1]) // 2
            out[:, top : top + size[0], left : left + size[1]] = inner
    return (out.clamp(0, 1) * 2 - 1).to(device)


def require_flags_fit_adapter(metadata: dict[str, Any], options: VideoSampleCommandOptions) -> None:
    """ConfigError when a flag does not fit the export: --last-image for its mode, the Framer-only flags
    (--tracks, --controlnet-*) for an SVD base."""
    if (metadata["mode"] == "interpolation") != (options.last_image is not None):
        need = "required" if metadata["mode"] == "interpolation" else "not used"
        problem = ConfigProblem(
            "--last-image", f"this is a {metadata['mode']} adapter: --last-image is {need}"
        )
        raise ConfigError([problem], "sample")
    wan_flags = ("prompt", "negative_prompt", "guidance_scale", "guidance_scale_2", "other_expert")
    wan_flags += ("save_frames",)
    given = [name for name in wan_flags if getattr(options, name) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        problem = f"a Wan flag; this export's base is {metadata.get('base', 'svd')!r}: drop {flag}"
        raise ConfigError([ConfigProblem(flag, problem)], "sample")
    framer_flags = {
        "--tracks": options.tracks,
        "--controlnet-scale": options.controlnet_scale,
        "--controlnet-step-range": options.controlnet_step_range,
    }
    given = [flag for flag, value in framer_flags.items() if value is not None]
    if metadata.get("base") != "framer" and given:
        flag = given[0]
        problem = ConfigProblem(
            flag,
            f"this export's base is {metadata.get('base', 'svd')!r}, which has no trajectory ControlNet: "
            "point tracks condition Framer exports only (model.base.name: framer); drop the flag",
        )
        raise ConfigError([problem], "sample")


def load_sampler_parts(
    adapter_dir: Path,
    metadata: dict[str, Any],
    options: VideoSampleCommandOptions,
    num_frames: int,
    device: str,
    dtype: torch.dtype,
):
    """(SamplerParts, FramerSampling or None) for the export: Framer's UNet, ControlNet and conditioning
    convention with the flags' tracks and ControlNet settings (the tracks file is read before any model
    loads), or stock SVD's pipeline with the adapter merged."""
    from framer_ds.tasks.video_lora.diffusion.sampling import SamplerParts

    if metadata.get("base") != "framer":
        pipe, _ = load_pipeline_with_adapter(adapter_dir, device, dtype)
        return SamplerParts.from_pipeline(pipe), None
    from framer_ds.tasks.video_lora.framer_inference import framer_sampler_parts
    from framer_ds.tasks.video_lora.sample_tracks import tracks_conditioning

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


def sample_to_file(adapter_dir: Path, options: VideoSampleCommandOptions) -> str:
    """Write one video from the adapter in `adapter_dir` (plus its frames as PNGs and `<stem>.json`, the
    seed and every conditioning value: `sample_record.py`); prints those values before the denoising
    starts and returns the closing line."""
    from framer_ds.data.progress import sampling_progress
    from framer_ds.tasks.video_lora.data.video_write import (
        H264,
        to_uint8_frames,
        write_frame_pngs,
        write_video,
    )
    from framer_ds.tasks.video_lora.diffusion.sampling import sample_video
    from framer_ds.tasks.video_lora.sample_record import (
        describe,
        motion_bucket_choice,
        sample_record,
        write_sample_record,
    )
    from framer_ds.tasks.video_lora.sample_shape import sample_shape

    device = options.resolved_device()
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    metadata = read_adapter_metadata(adapter_dir)
    require_flags_fit_adapter(metadata, options)
    height, width, num_frames = sample_shape(metadata, options.height, options.width, options.num_frames)
    metadata = {**metadata, "height": height, "width": width}  # what the rest samples at (sample_shape.py)
    size = (height, width)
    first = load_frame(options.image, *size, device, options.resize)
    last = load_frame(options.last_image, *size, device, options.resize) if options.last_image else None
    fps = options.fps or metadata.get("fps") or DEFAULT_FPS
    motion = motion_bucket_choice(options.motion_bucket, metadata, first, last, num_frames)
    parts, framer = load_sampler_parts(adapter_dir, metadata, options, num_frames, device, dtype)
    settings = {"num_frames": num_frames, "height": size[0], "width": size[1], "fps": fps, **motion}
    if framer is not None:
        settings.update(
            controlnet_scale=framer.conditioning_scale, controlnet_step_range=list(framer.step_range)
        )
    record = sample_record(
        adapter_dir, metadata, options, {**settings, "device": device, "dtype": str(dtype)}
    )
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
            framer=framer,
            guidance_schedule=options.guidance_schedule,
            on_step=bar.update,
        )
    pixels = to_uint8_frames(frames)
    codec = write_video(options.out, pixels, fps)
    frames_note = f"; the frames as PNGs in {write_frame_pngs(options.out, pixels)}" if options.frames else ""
    record_file = write_sample_record(options.out, {**record, "video": str(options.out), "codec": codec})
    return (
        f"wrote {options.out} ({'H.264' if codec == H264 else codec}): {len(pixels)} frames at "
        f"{size[1]}x{size[0]}, conditioned on {fps:g} fps, motion bucket {motion['motion_bucket']}, seed "
        f"{options.seed}{frames_note}; settings in {record_file}"
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
