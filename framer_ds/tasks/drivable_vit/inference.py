"""`final/` of a drivable_vit run and `framer-ds sample` from it.

`final/` holds `model.safetensors` (the gathered weights, correct under ZeRO-3) and `drivable_vit.json`
(the architecture, the views in model order, frames, pixel normalisation and the training set's
ego-motion statistics), so `load_drivable_vit(final)` rebuilds the model and normalises inputs exactly
as training did, without the training manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pydantic import Field
from safetensors.torch import load_file

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError
from framer_ds.config.renames import move_renamed_keys, schema_renames
from framer_ds.config.schema import GENERIC_MODEL_KEYS
from framer_ds.engine.export import read_export_json
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.base import SampleCommandOptions
from framer_ds.tasks.drivable_vit.config import DrivableModelConfig
from framer_ds.tasks.drivable_vit.model import DrivableViT
from framer_ds.tasks.drivable_vit.multiview_manifest import EGO_MOTION_DIM, EgoStatistics, PixelTransform
from framer_ds.tasks.drivable_vit.overlays import overlay_panel, to_uint8_image

WEIGHTS, RECORD = "model.safetensors", "drivable_vit.json"


class DrivableSampleOptions(SampleCommandOptions):
    """`framer-ds sample RUN/final --images l0.png c0.png r0.png l1.png ... --out DIR`: drivable masks
    of the last frame (or every frame) per view, as 0/255 PNGs, plus an overlay."""

    images: list[Path] = Field(
        min_length=1,
        description="T x V images, frame by frame (oldest first), each frame's views in the training "
        "order (drivable_vit.json 'views'), e.g. left0 center0 right0 left1 center1 right1 ...",
    )
    ego_motion: Path | None = Field(
        None, description="JSON file with the [T, 9] ego motion (raw; needed when the model uses it)."
    )
    out: Path = Field(description="Folder for <view>[_<frame>].png masks and overlay.png.")


@dataclass
class LoadedModel:
    model: DrivableViT
    views: list[str]
    frames: int
    transform: PixelTransform
    ego: EgoStatistics | None


def write_record(out_dir: Path, config, ego: EgoStatistics | None) -> None:
    atomic_write_json(
        Path(out_dir) / RECORD,
        {
            "model": config.model.model_dump(mode="json"),
            "views": list(config.data.views),
            "frames": config.data.frames,
            "mean": list(config.data.mean),
            "std": list(config.data.std),
            "ego_statistics": None if ego is None else {"mean": list(ego.mean), "std": list(ego.std)},
        },
    )


def load_drivable_vit(export_dir: Path, device: str = "cpu") -> LoadedModel:
    """The exported model in float32 on `device`, in eval mode, with its input normalisation."""
    export_dir = Path(export_dir)
    if not (export_dir / RECORD).is_file() or not (export_dir / WEIGHTS).is_file():
        raise ConfigError(
            [
                ConfigProblem(
                    str(export_dir), f"needs {RECORD} and {WEIGHTS}: pass a drivable_vit run's final/"
                )
            ]
        )
    record = read_export_json(export_dir / RECORD)
    # an export written before a model key was renamed (img_size) reads as this version's section
    own = {k: v for k, v in record["model"].items() if k not in GENERIC_MODEL_KEYS}
    config = DrivableModelConfig.model_validate(move_renamed_keys(own, schema_renames(DrivableModelConfig)))
    model = DrivableViT(config, views=len(record["views"]), frames=record["frames"])
    state = {k: v.float() for k, v in load_file(str(export_dir / WEIGHTS)).items()}
    model.load_state_dict(state)
    stats = record.get("ego_statistics")
    ego = EgoStatistics(tuple(stats["mean"]), tuple(stats["std"])) if stats else None
    transform = PixelTransform(config.image_size, tuple(record["mean"]), tuple(record["std"]))
    return LoadedModel(model.to(device).eval(), record["views"], record["frames"], transform, ego)


def _read_image(path: Path) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except Exception as exc:
        raise InputDataError(f"cannot read the image {path} ({type(exc).__name__}: {exc})") from exc


@torch.no_grad()
def sample_command(export_dir: Path, options: DrivableSampleOptions) -> str:
    loaded = load_drivable_vit(export_dir, options.resolved_device())
    views, frames = loaded.views, loaded.frames
    if len(options.images) != len(views) * frames:
        raise ConfigError(
            [
                ConfigProblem(
                    "--images",
                    f"got {len(options.images)} images; this model takes {frames} frame(s) x "
                    f"{len(views)} views {views} = {frames * len(views)}, frame by frame",
                )
            ],
            "command-line options",
        )
    pixels = torch.stack([loaded.transform.image(_read_image(p)) for p in options.images])
    pixels = pixels.view(1, frames, len(views), *pixels.shape[1:])
    ego = None
    if loaded.model.temporal is not None and loaded.model.temporal.ego is not None:
        if options.ego_motion is None:
            raise ConfigError(
                [
                    ConfigProblem(
                        "--ego-motion", f"this model was trained with ego motion: pass [T={frames}, 9]"
                    )
                ]
            )
        raw = np.asarray(json.loads(options.ego_motion.read_text()), dtype=np.float64)
        if raw.shape != (frames, EGO_MOTION_DIM):
            raise ConfigError([ConfigProblem("--ego-motion", f"shape {raw.shape}, expected ({frames}, 9)")])
        ego = loaded.ego.normalise(raw).unsqueeze(0)
    device = options.resolved_device()
    logits = loaded.model(pixels.to(device), None if ego is None else ego.to(device))["logits"][0].cpu()
    options.out.mkdir(parents=True, exist_ok=True)
    lines = []
    kept = logits.shape[0]
    for f in range(kept):
        suffix = "" if kept == 1 else f"_{frames - kept + f}"
        for v, view in enumerate(views):
            mask = logits[f, v] > 0
            path = options.out / f"{view}{suffix}.png"
            Image.fromarray(mask.numpy().astype(np.uint8) * 255).save(path)
            lines.append(f"{path}: {float(mask.float().mean()):.1%} drivable")
    last = pixels[0, -1]
    mean, std = loaded.transform.mean, loaded.transform.std
    images = [to_uint8_image(last[v], mean, std) for v in range(len(views))]
    predicted = [(logits[-1, v] > 0).numpy() for v in range(len(views))]
    overlay_panel(images, predicted, predicted).save(options.out / "overlay.png")
    lines.append(f"{options.out / 'overlay.png'}: the prediction over the last frame")
    return "\n".join(lines)
