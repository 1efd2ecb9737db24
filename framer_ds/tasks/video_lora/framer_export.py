"""`framer-ds export RUN/final --format framer --out DIR`: full `unet/` + `controlnet/` in Framer's layout.

What Framer's app (`UNetSpatioTemporalConditionModel.from_pretrained(DIR/unet, custom_resume=True)`,
`ControlNetSVDModel.from_pretrained(DIR/controlnet)`) and ComfyUI-FramerWrapper (every named parameter
read by name from the safetensors) load: `config.json` + `diffusion_pytorch_model.safetensors` per
folder, the UNet with `in_channels` 9 and `mask_token`, the LoRA merged in. A run that trained the
ControlNet writes its ControlNet; otherwise the base Framer's is copied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import building_dir, publish_dir
from framer_ds.tasks.video_lora.export_formats import VideoExportCommandOptions, register_export_format
from framer_ds.tasks.video_lora.framer_setup import CONTROLNET_DIR
from framer_ds.tasks.video_lora.inference import read_adapter_metadata


def _problem(key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, message)], "export")


def export_framer(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    from peft import PeftModel

    from framer_ds.diffusion.framer_model import load_framer_controlnet, load_framer_unet

    metadata = read_adapter_metadata(adapter_dir)
    if metadata.get("base") != "framer":
        raise _problem(
            "--format",
            f"{adapter_dir} was trained on stock SVD (model.base svd), whose UNet has no mask_token and "
            "another conditioning convention; --format framer needs a model.base framer run. Use "
            "--format merged.",
        )
    out = Path(options.out)
    if out.exists() and any(out.iterdir()):
        raise _problem("--out", f"{out} exists and is not empty; choose a new directory")
    base = Path(options.base or metadata["framer_path"])
    dtype = getattr(torch, options.dtype)
    unet = load_framer_unet(base / "unet")
    if metadata.get("has_adapter"):
        unet = PeftModel.from_pretrained(unet, adapter_dir).merge_and_unload()
    trained_controlnet = Path(adapter_dir) / CONTROLNET_DIR
    controlnet = load_framer_controlnet(
        trained_controlnet if metadata.get("has_controlnet") else base / "controlnet"
    )
    with building_dir(out) as staging:
        for name, model in (("unet", unet), ("controlnet", controlnet)):
            if model.dtype != dtype:  # diffusers warns on every dtype-carrying .to(), even a no-op
                model.to(dtype=dtype)
            model.save_pretrained(staging / name, safe_serialization=True)
        shutil.copy2(Path(adapter_dir) / "framer_ds_video_lora.json", staging / "framer_ds_video_lora.json")
    if not publish_dir(staging, out, replace=False):
        raise _problem("--out", f"{out} appeared while writing; choose a new directory")
    merged = "LoRA merged" if metadata.get("has_adapter") else "UNet unchanged"
    source = "trained" if metadata.get("has_controlnet") else f"copied from {base}"
    return (
        f"wrote {out}: unet/ ({merged}, 9 input channels + mask_token) and controlnet/ ({source}) in "
        "Framer's layout; load them with Framer's app (--model DIR) or ComfyUI-FramerWrapper"
    )


register_export_format("framer", export_framer)
