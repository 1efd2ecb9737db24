"""`framer-ds export RUN/final --format FORMAT --out DIR`: one adapter, written for each loader.

- `peft`: the adapter as training wrote it (`PeftModel.from_pretrained`), copied with its metadata
  (and a Framer run's trained `controlnet/` and `mask_token.safetensors`).
- `merged`: the LoRA merged into the base UNet (a diffusers pipeline for image-to-video, the UNet
  alone for interpolation), `inference.export_merged`; a base with its own UNet class (Framer)
  registers its own writer in `MERGED_BY_BASE`.
- `comfyui`: an SVD image-to-video LoRA in ComfyUI's generic format, `comfyui_keys` below.
- `framer`: Framer checkpoints (registered by their own module).

Each format is a function `(adapter_dir, options) -> str` in `EXPORT_FORMATS`; a new one registers
itself with `register_export_format` and adds its name to `FORMAT_NAMES`. Every format writes through
`engine.export_out` (a directory format: `export_directory`, a new or empty --out; a single-file format:
`export_file`, beside the other files of --out), so none deletes or replaces a file it did not write.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from safetensors.torch import load_file, save_file

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.schema import StrictModel
from framer_ds.engine.export_out import export_directory, export_file
from framer_ds.tasks.video_lora.comfyui_keys import comfyui_lora_state_dict
from framer_ds.tasks.video_lora.framer_setup import CONTROLNET_DIR, MASK_TOKEN_FILE
from framer_ds.tasks.video_lora.inference import EXPORT_METADATA, export_merged, read_adapter_metadata

FORMAT_NAMES = ("peft", "merged", "comfyui", "framer")
COMFYUI_FILE = "svd_lora_comfyui.safetensors"
PEFT_FILES = (
    "adapter_model.safetensors",
    "adapter_config.json",
    EXPORT_METADATA,
    "README.md",
    MASK_TOKEN_FILE,
)
PEFT_DIRS = (CONTROLNET_DIR,)  # a Framer run's trained ControlNet


class VideoExportCommandOptions(StrictModel):
    """`framer-ds export RUN/final --format peft|merged|comfyui|framer --out DIR [--overwrite]`."""

    format: Literal["peft", "merged", "comfyui", "framer"] = Field(
        description="'peft': the adapter as is (PeftModel.from_pretrained); 'merged': the LoRA merged into "
        "the base UNet (a StableVideoDiffusionPipeline directory for image-to-video, the UNet for "
        "interpolation); 'comfyui': an SVD image-to-video LoRA in ComfyUI's generic key format "
        "(diffusion_model.<original SVD key>); 'framer': a Framer checkpoint."
    )
    out: Path = Field(
        description="Where to write: 'comfyui' adds its one file to this folder (created if needed), beside "
        "the files already there; 'peft', 'merged', 'framer' write a directory, which must be new or empty."
    )
    overwrite: bool = Field(
        False,
        description="'comfyui': replace a file of the same name in --out (only that file). Refused by the "
        "directory formats, which never replace a directory.",
    )
    base: Path | None = Field(
        None,
        description="The base model directory ('merged', 'comfyui': the SVD directory; 'framer' and a Framer "
        "run's 'merged': the Framer directory); default: the one training used.",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Dtype of the weights written ('merged', 'comfyui', 'framer')."
    )


ExportFormat = Callable[[Path, VideoExportCommandOptions], str]
EXPORT_FORMATS: dict[str, ExportFormat] = {}
MERGED_BY_BASE: dict[str, ExportFormat] = {}
"""`--format merged` for a run whose `model.base` has its own UNet class, by base name (base.name)."""


def register_export_format(name: str, function: ExportFormat) -> ExportFormat:
    if name not in FORMAT_NAMES:
        raise ValueError(f"internal: add {name!r} to FORMAT_NAMES and the `format` Literal first")
    EXPORT_FORMATS[name] = function
    return function


def export_format(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """Dispatch `--format` to its writer; returns the line to print."""
    function = EXPORT_FORMATS.get(options.format)
    if function is None:
        problem = ConfigProblem(
            "--format",
            f"{options.format!r} is not available in this version; available: {', '.join(EXPORT_FORMATS)}",
        )
        raise ConfigError([problem], "export")
    return function(Path(adapter_dir), options)


def export_peft(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    """The adapter exactly as training saved it, with its metadata (`PeftModel.from_pretrained(DIR)`),
    and a trained ControlNet beside it."""
    read_adapter_metadata(adapter_dir)  # a clear error when this is not a video_lora adapter
    out = Path(options.out)
    with export_directory(out, options.overwrite) as staging:
        for name in PEFT_FILES:
            if (adapter_dir / name).is_file():
                shutil.copy2(adapter_dir / name, staging / name)
        for name in PEFT_DIRS:
            if (adapter_dir / name).is_dir():
                shutil.copytree(adapter_dir / name, staging / name)
    parts = []
    if (out / "adapter_model.safetensors").is_file():
        parts.append(f"the peft adapter (PeftModel.from_pretrained(unet, {str(out)!r}))")
    if (out / CONTROLNET_DIR).is_dir():
        parts.append(f"the trained ControlNet ({CONTROLNET_DIR}/)")
    if (out / MASK_TOKEN_FILE).is_file():
        parts.append(f"the trained mask_token ({MASK_TOKEN_FILE})")
    written = " and ".join(parts) or f"the metadata only ({adapter_dir} holds no trained weights)"
    return f"wrote {out}: {written}"


def export_merged_format(adapter_dir: Path, options: VideoExportCommandOptions) -> str:
    writer = MERGED_BY_BASE.get(read_adapter_metadata(adapter_dir).get("base", "svd"))
    if writer is not None:
        return writer(adapter_dir, options)
    return export_merged(adapter_dir, options.out, options.dtype, options.base, options.overwrite)


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
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = Path(options.base or metadata["base_model"])
    unet_config = json.loads((base / "unet" / "config.json").read_text())
    tensors = load_file(adapter_dir / "adapter_model.safetensors")
    converted = comfyui_lora_state_dict(tensors, adapter_config, unet_config)
    dtype = getattr(torch, options.dtype)
    converted = {k: v if k.endswith(".alpha") else v.to(dtype).contiguous() for k, v in converted.items()}
    with export_file(options.out, COMFYUI_FILE, options.overwrite) as path:
        save_file(converted, str(path), metadata=comfyui_file_metadata({**metadata, "format": "comfyui"}))
    modules = sum(k.endswith(".alpha") for k in converted)
    return (
        f"wrote {Path(options.out) / COMFYUI_FILE}: {modules} LoRA modules in ComfyUI's format (put it in, "
        "or export straight to, ComfyUI/models/loras) and apply it with LoraLoaderModelOnly to an SVD "
        "image-to-video model"
    )


def comfyui_file_metadata(record: dict) -> dict[str, str]:
    """The safetensors header of a ComfyUI LoRA file: what made it (the adapter's metadata) travels
    inside the one file, since a single-file export adds nothing else to a loader's folder."""
    return {"format": "pt", "framer_ds": "video_lora", EXPORT_METADATA: json.dumps(record)}


register_export_format("peft", export_peft)
register_export_format("merged", export_merged_format)
register_export_format("comfyui", export_comfyui)
