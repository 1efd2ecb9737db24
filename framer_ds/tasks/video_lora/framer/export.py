"""`framer-ds export RUN/final --format framer --out DIR`: full `unet/` + `controlnet/` in Framer's layout.

What Framer's app (`UNetSpatioTemporalConditionModel.from_pretrained(DIR/unet, custom_resume=True)`,
`ControlNetSVDModel.from_pretrained(DIR/controlnet)`) and ComfyUI-FramerWrapper (every named parameter
read by name from the safetensors) load: `config.json` + `diffusion_pytorch_model.safetensors` per
folder, the UNet with `in_channels` 9 and `mask_token`, the LoRA merged in. A run that trained the
ControlNet writes its ControlNet; otherwise the base Framer's is copied. `--format merged` of a Framer
run writes the same merged UNet alone, and `--format peft` copies the trained ControlNet and mask_token
beside the adapter (`FRAMER_EXPORT_FORMATS`, what `FramerFamily.export_formats` adds to SVD's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import check_not_empty, gathered_trainable_state_dict
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.engine.export_out import check_export_directory, export_directory
from framer_ds.tasks.video_lora.shared.exports import (
    EXPORT_METADATA,
    ExportFormat,
    VideoExportCommandOptions,
    export_peft,
    read_adapter_metadata,
)

FRAMER_SUBFOLDERS = ("unet", "controlnet")
CONTROLNET_DIR = "controlnet"
MASK_TOKEN_FILE = "mask_token.safetensors"
"""final/'s trained mask_token (`model.train_mask_token`): {"mask_token": [1,1,C,1,1]}, Framer's key."""


def save_framer_weights(family: Any, accelerator, model: torch.nn.Module, out_dir: Path) -> dict[str, Any]:
    """A Framer run's final/ (`family`: its `FramerFamily`): the UNet's peft adapter at the top
    (`PeftModel.from_pretrained(framer_unet, final)`) when a LoRA trains, the whole ControlNet in
    `controlnet/` when it trains, the mask_token in `MASK_TOKEN_FILE` when it trains. Every rank (gathers
    under ZeRO-3); returns the metadata entries that describe it."""
    state = gathered_trainable_state_dict(accelerator, model)
    framer_model = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        out_dir = Path(out_dir)
        if family.trains_lora:
            adapter = {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")}
            check_not_empty(adapter, "the UNet LoRA")
            framer_model.unet.save_pretrained(out_dir, state_dict=adapter, safe_serialization=True)
        if family.options.train_mask_token:
            token = state.get("mask_token")
            check_not_empty({"mask_token": token} if token is not None else {}, "the mask_token")
            save_file({"mask_token": token.contiguous()}, str(out_dir / MASK_TOKEN_FILE), {"format": "pt"})
        if family.trains_controlnet:
            weights = {
                k.removeprefix("controlnet."): v for k, v in state.items() if k.startswith("controlnet.")
            }
            check_not_empty(weights, "the ControlNet")
            missing = set(framer_model.controlnet.state_dict()) - set(weights)
            if missing:
                raise RuntimeError(f"internal: ControlNet export lacks {sorted(missing)[:3]}")
            # diffusers' save_pretrained has no state_dict argument (it would write ZeRO-3's empty
            # partitions): the config and the gathered tensors, in its file layout
            folder = out_dir / CONTROLNET_DIR
            framer_model.controlnet.save_config(folder)
            tensors = {k: v.contiguous() for k, v in weights.items()}
            save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"), {"format": "pt"})
    accelerator.wait_for_everyone()
    return {
        "base": "framer",
        "framer_path": str(family.framer_path()),
        "train_modules": family.framer.train_modules,
        "controlnet_cond_scale": family.framer.controlnet_cond_scale,
        "controlnet_step_range": list(family.framer.controlnet_step_range),
        "has_adapter": family.trains_lora,
        "has_controlnet": family.trains_controlnet,
        "has_mask_token": family.options.train_mask_token,
    }


def load_framer_weights(family: Any, model: torch.nn.Module, export_dir: Path) -> None:
    """`framer-ds eval RUN`: what `save_framer_weights` wrote into the FramerModel `family` built: the
    UNet's peft adapter when the run trained one, `controlnet/` (strictly) when it trained the
    ControlNet, the mask_token when it trained that."""
    from safetensors.torch import load_file

    export_dir = Path(export_dir)
    adapter = export_dir / "adapter_model.safetensors"
    weights = export_dir / CONTROLNET_DIR / "diffusion_pytorch_model.safetensors"
    token = export_dir / MASK_TOKEN_FILE
    wanted = [
        (family.trains_lora, adapter),
        (family.trains_controlnet, weights),
        (family.options.train_mask_token, token),
    ]
    missing = [str(p.relative_to(export_dir)) for needed, p in wanted if needed and not p.is_file()]
    if missing:
        problem = ConfigProblem(
            str(export_dir),
            f"a Framer-base export of train_modules {family.framer.train_modules!r} lacks "
            f"{', '.join(missing)}: pass the final/ or best/ of a finished run",
        )
        raise ConfigError([problem], "eval")
    if family.trains_lora:
        load_peft_adapter(model.unet, export_dir)
    if family.trains_controlnet:
        model.controlnet.load_state_dict(load_file(weights), strict=True)
    if family.options.train_mask_token:
        with torch.no_grad():
            model.mask_token.copy_(read_mask_token(export_dir).reshape(model.mask_token.shape))


def read_mask_token(export_dir: Path) -> Tensor:
    """The trained mask_token of an export (`MASK_TOKEN_FILE`), with a clear error when it is absent."""
    from safetensors.torch import load_file

    path = Path(export_dir) / MASK_TOKEN_FILE
    if not path.is_file():
        problem = ConfigProblem(
            str(export_dir),
            f"its metadata says the run trained the mask_token but {MASK_TOKEN_FILE} is missing: pass a "
            "complete final/ or best/ of the run",
        )
        raise ConfigError([problem], "loading the export")
    return load_file(str(path))["mask_token"]


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

    from framer_ds.tasks.video_lora.framer.model import load_framer_unet

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
    from framer_ds.tasks.video_lora.framer.model import load_framer_controlnet

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


def export_framer_peft(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """`--format peft` of a Framer run: the adapter, and the ControlNet and mask_token it trained."""
    trained = {
        CONTROLNET_DIR: f"the trained ControlNet ({CONTROLNET_DIR}/)",
        MASK_TOKEN_FILE: f"the trained mask_token ({MASK_TOKEN_FILE})",
    }
    return export_peft(adapter_dir, options, trained)


FRAMER_EXPORT_FORMATS: dict[str, ExportFormat] = {
    "peft": export_framer_peft,
    "merged": export_framer_merged,
    "framer": export_framer,
}
