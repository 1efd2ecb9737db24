"""`framer-ds export RUN/final --format framer --out DIR`: full `unet/` + `controlnet/` in Framer's layout.

What Framer's app (`UNetSpatioTemporalConditionModel.from_pretrained(DIR/unet, custom_resume=True)`,
`ControlNetSVDModel.from_pretrained(DIR/controlnet)`) and ComfyUI-FramerWrapper (every named parameter
read by name from the safetensors) load: `config.json` + `diffusion_pytorch_model.safetensors` per
folder, the UNet with `in_channels` 9 and `mask_token`, the LoRA merged in. A run that trained the
ControlNet writes its ControlNet; otherwise the base Framer's is copied. `--format merged` of a Framer
run writes the same merged UNet alone (its own writer in `MERGED_BY_BASE`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export_out import check_export_directory, export_directory
from framer_ds.tasks.video_lora.export_formats import (
    MERGED_BY_BASE,
    VideoExportCommandOptions,
    register_export_format,
)
from framer_ds.tasks.video_lora.framer_setup import CONTROLNET_DIR, read_mask_token
from framer_ds.tasks.video_lora.inference import EXPORT_METADATA, read_adapter_metadata


def _problem(key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, message)], "export")


def _framer_run(adapter_dir: Path, options: VideoExportCommandOptions, fmt: str) -> tuple[dict, Path, Path]:
    """(metadata, base Framer directory, out) of a Framer-base run, checked."""
    metadata = read_adapter_metadata(adapter_dir)
    if metadata.get("base") != "framer":
        raise _problem(
            "--format",
            f"{adapter_dir} was trained on stock SVD (model.base.name svd), whose UNet has no mask_token and "
            f"another conditioning convention; --format {fmt} needs a model.base.name framer run. Use "
            "--format merged.",
        )
    out = Path(options.out)
    check_export_directory(out, options.overwrite)  # before loading and merging
    return metadata, Path(options.base or metadata["framer_path"]), out


def merged_framer_unet(adapter_dir: Path, metadata: dict, base: Path, dtype: torch.dtype) -> torch.nn.Module:
    """Framer's UNet (9 input channels + mask_token) with the run's LoRA merged in and its trained
    mask_token (`model.train_mask_token`) in place of the base's, in `dtype`."""
    from peft import PeftModel

    from framer_ds.tasks.video_lora.models.framer_model import load_framer_unet

    unet = load_framer_unet(base / "unet")
    if metadata.get("has_adapter"):
        unet = PeftModel.from_pretrained(unet, adapter_dir).merge_and_unload()
    if metadata.get("has_mask_token"):
        with torch.no_grad():
            unet.mask_token.copy_(read_mask_token(adapter_dir).reshape(unet.mask_token.shape))
    return _in_dtype(unet, dtype)


def _in_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    if model.dtype != dtype:  # diffusers warns on every dtype-carrying .to(), even a no-op
        model.to(dtype=dtype)
    return model


def export_framer(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    from framer_ds.tasks.video_lora.models.framer_model import load_framer_controlnet

    metadata, base, out = _framer_run(adapter_dir, options, "framer")
    dtype = getattr(torch, options.dtype)
    unet = merged_framer_unet(adapter_dir, metadata, base, dtype)
    trained_controlnet = Path(adapter_dir) / CONTROLNET_DIR
    controlnet = load_framer_controlnet(
        trained_controlnet if metadata.get("has_controlnet") else base / "controlnet"
    )
    with export_directory(out) as staging:
        for name, model in (("unet", unet), ("controlnet", _in_dtype(controlnet, dtype))):
            model.save_pretrained(staging / name, safe_serialization=True)
        shutil.copy2(Path(adapter_dir) / EXPORT_METADATA, staging / EXPORT_METADATA)
    merged = "LoRA merged" if metadata.get("has_adapter") else "UNet unchanged"
    merged += ", trained mask_token" if metadata.get("has_mask_token") else ""
    source = "trained" if metadata.get("has_controlnet") else f"copied from {base}"
    return (
        f"wrote {out}: unet/ ({merged}, 9 input channels + mask_token) and controlnet/ ({source}) in "
        "Framer's layout; load them with Framer's app (--model DIR) or ComfyUI-FramerWrapper"
    )


def export_framer_merged(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """`--format merged` for a Framer run: Framer's UNet with the LoRA merged (what the merged export of
    an SVD interpolation run is, on Framer's UNet); the ControlNet lives in `--format framer`."""
    metadata, base, out = _framer_run(adapter_dir, options, "merged")
    if not metadata.get("has_adapter") and not metadata.get("has_mask_token"):
        raise _problem(
            "--format",
            f"{adapter_dir} trained only the ControlNet (model.base.train_modules controlnet): there is no "
            "LoRA to merge; use --format framer (unet/ + the trained controlnet/) or --format peft "
            "(or train the mask_token too: model.train_mask_token).",
        )
    unet = merged_framer_unet(adapter_dir, metadata, base, getattr(torch, options.dtype))
    with export_directory(out) as staging:
        unet.save_pretrained(staging, safe_serialization=True)
        (staging / EXPORT_METADATA).write_text(json.dumps({**metadata, "merged": True}, indent=2))
    controlnet = " (the trained ControlNet: --format framer)" if metadata.get("has_controlnet") else ""
    return (
        f"wrote {out}: Framer's UNet with the LoRA merged (9 input channels + mask_token){controlnet}; load "
        "it with Framer's UNetSpatioTemporalConditionModel.from_pretrained(DIR, custom_resume=True)"
    )


register_export_format("framer", export_framer)
MERGED_BY_BASE["framer"] = export_framer_merged
