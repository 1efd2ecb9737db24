"""`framer-ds export RUN/final --format FORMAT --out DIR`: one adapter, written for each loader.

- `peft`: the adapter as training wrote it (`PeftModel.from_pretrained`), copied with its metadata
  (and the files a family adds: a Framer run's trained `controlnet/` and `mask_token.safetensors`).
- `merged`: the LoRA merged into the base UNet (a diffusers pipeline for image-to-video, the UNet
  alone for interpolation), `svd/export.export_merged`; Framer has its own (framer/export.py).
- `comfyui`: one LoRA file in ComfyUI's key format (each family maps its module names; the writer and
  the scale are shared/comfyui_lora.py).
- `framer`: Framer checkpoints (framer/export.py).

Each format is a function `(adapter_dir, options) -> str`; each base family lists the ones it writes
(`SvdFamily.export_formats`: `SVD_EXPORT_FORMATS`, Framer's adds its own, Wan's are its own), so which
formats exist never depends on which module was imported first. Every format writes through
`engine.export_out` (a directory format: `export_directory`, a new or empty --out; a single-file format:
`export_file`, beside the other files of --out), so none deletes or replaces a file it did not write.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pydantic import Field

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError
from framer_ds.config.schema import StrictModel
from framer_ds.engine.export import read_export_json
from framer_ds.engine.export_out import export_directory
from framer_ds.tasks.video_lora.shared.data.video_clips import resize_and_crop
from framer_ds.tasks.video_lora.shared.options import FamilySampleFlags

FORMAT_NAMES = ("peft", "merged", "comfyui", "framer")
EXPORT_METADATA = "framer_ds_video_lora.json"
PEFT_FILES = ("adapter_model.safetensors", "adapter_config.json", EXPORT_METADATA, "README.md")


def trained_fps_metadata(config_fps: float | None, trained: list[float]) -> dict[str, Any]:
    """What the adapter records about fps (SVD's fps conditioning, LTX-2's frame rate: the sampler's
    default): the configured value, or the median (and range) of the fps values training conditioned on
    when `model.fps` was null (each clip's source fps / stride)."""
    if config_fps is not None:
        return {"fps": config_fps, "fps_source": "model.fps"}
    if not trained:
        return {"fps": None, "fps_source": "unknown"}
    return {
        "fps": statistics.median(trained),
        "fps_range": [min(trained), max(trained)],
        "fps_source": "median of the training clips' fps (source fps / stride)",
    }


class VideoExportCommandOptions(StrictModel):
    """`framer-ds export RUN/final --format peft|merged|comfyui|framer --out DIR [--overwrite]`."""

    format: Literal["peft", "merged", "comfyui", "framer"] = Field(
        description="'peft': the adapter as is (PeftModel.from_pretrained); 'merged': the LoRA merged into "
        "the base UNet (a StableVideoDiffusionPipeline directory for image-to-video, the UNet for "
        "interpolation); 'comfyui': one LoRA file ComfyUI's LoRA loader reads (an SVD image-to-video, Wan or "
        "LTX-2 adapter; diffusion_model.<the original model's module>); 'framer': a Framer checkpoint."
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
        description="The base model directory ('merged', an SVD run's 'comfyui': the SVD directory; "
        "'framer' and a Framer run's 'merged': the Framer directory); default: the one training used.",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Dtype of the weights written ('merged', 'comfyui', 'framer')."
    )


ExportFormat = Callable[[Path, VideoExportCommandOptions], str]


def export_format(
    adapter_dir: Path, options: VideoExportCommandOptions, formats: Mapping[str, ExportFormat]
) -> str:
    """Dispatch `--format` to the base family's writer (`formats`); returns the line to print."""
    function = formats.get(options.format)
    if function is None:
        problem = ConfigProblem(
            "--format",
            f"{options.format!r} is not available for this base; available: {', '.join(formats)}",
        )
        raise ConfigError([problem], "export")
    return function(Path(adapter_dir), options)


def export_peft(
    adapter_dir: Path,
    options: VideoExportCommandOptions,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The adapter exactly as training saved it, with its metadata (`PeftModel.from_pretrained(DIR)`),
    and what else the family trained beside it (`extra`: file or folder name -> what it is, e.g. a
    Framer run's `controlnet/`)."""
    read_adapter_metadata(adapter_dir)  # a clear error when this is not a video_lora adapter
    out, extra = Path(options.out), extra or {}
    with export_directory(out, options.overwrite) as staging:
        for name in (*PEFT_FILES, *extra):
            if (adapter_dir / name).is_file():
                shutil.copy2(adapter_dir / name, staging / name)
            elif name in extra and (adapter_dir / name).is_dir():
                shutil.copytree(adapter_dir / name, staging / name)
    parts = []
    if (out / "adapter_model.safetensors").is_file():
        parts.append(f"the peft adapter (PeftModel.from_pretrained(unet, {str(out)!r}))")
    parts += [what for name, what in extra.items() if (out / name).exists()]
    written = " and ".join(parts) or f"the metadata only ({adapter_dir} holds no trained weights)"
    return f"wrote {out}: {written}"


def flag_name(field: str) -> str:
    """A sample option's field -> its flag (`guidance_scale_2` -> `--guidance-scale-2`)."""
    return "--" + field.replace("_", "-")


def refuse_foreign_flags(options: Any, base: str, own: tuple[type[FamilySampleFlags], ...]) -> None:
    """ConfigError naming the first flag given (set on the command line) that belongs to another base
    family's flags than `own`, with that family's `refusal`: one check for every family's export, so a
    flag an export cannot honour is never silently ignored. `own`'s flags include what they inherit (Wan's
    `--prompt`, declared once in `TextSampleFlags` for every text-conditioned base)."""
    mine = {name for group in own for name in group.model_fields}
    for group in type(options).__mro__:
        if not (isinstance(group, type) and issubclass(group, FamilySampleFlags)):
            continue
        if group is FamilySampleFlags or group in own:
            continue
        declared = [name for name in vars(group).get("__annotations__", {}) if name in group.model_fields]
        # set on the command line (a None is what an unset flag reads: `prompt=None` gives nothing)
        given = [
            n
            for n in declared
            if n not in mine and n in options.model_fields_set and getattr(options, n) is not None
        ]
        if given:
            flag = flag_name(given[0])
            problem = ConfigProblem(flag, group.refusal.format(base=repr(base), flag=flag))
            raise ConfigError([problem], "sample")


def require_last_image(metadata: dict[str, Any], options: Any, kind: str = "") -> None:
    """--last-image exactly when the export interpolates (`kind`: the base's name in the message)."""
    if (metadata["mode"] == "interpolation") != (options.last_image is not None):
        need = "required" if metadata["mode"] == "interpolation" else "not used"
        what = f"{metadata['mode']} {kind} adapter" if kind else f"{metadata['mode']} adapter"
        problem = ConfigProblem("--last-image", f"this is a {what}: --last-image is {need}")
        raise ConfigError([problem], "sample")


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
