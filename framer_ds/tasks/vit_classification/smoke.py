"""`framer-ds smoke` for vit_classification recipes (tasks/smoke.py says what a smoke keeps and swaps):
a pretrained ViT directory becomes a width- and depth-tiny random ViTForImageClassification of the same
architecture (image size, patch, channels, label count, qkv bias stay; width 32 in 2 heads, 2 layers),
and an ImageFolder root that is not on disk becomes a few images per class in its own layout
(train/CLASS/*.JPEG, val/CLASS/*.JPEG) at the model's image size."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import (
    SmokeHooks,
    SmokeStandIns,
    architecture_source,
    read_config,
    stand_in_dir,
    tiny_note,
)

CLASSES = ("class_a", "class_b", "class_c")


class VitSmoke(SmokeHooks):
    """The vit_classification task's smoke hooks (a mixin of its task, which supplies `config`)."""

    config: Any

    def smoke_stand_ins(self, root: Path) -> SmokeStandIns:
        found = SmokeStandIns()
        source, data = self.config.model.source, self.config.data
        image_size = None
        if source.path is not None:
            arch = architecture_source(self.config, source.path)
            if arch is None:
                problem = f"{source.path} is not on disk and framer_ds ships no architecture for it"
                raise ConfigError([ConfigProblem("model.source.path", problem)], "smoke")
            folder, name = arch
            config = read_config(folder)
            image_size = config["image_size"]
            key = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
            out = build_once(
                stand_in_dir(root, "bases", {"what": "ViT", "config": key}),
                ".framer_smoke_vit_complete",
                lambda staging: _save_tiny_vit(staging, config),
                "tiny ViT stand-in",
            )
            found.overrides.append(f"model.source.path={out}")
            found.swapped.append(tiny_note("model.source.path", source.path, name, out, "ViT"))
        if data.source.path is not None and not Path(data.source.path).exists():
            size = data.image_size or image_size or (source.config or {}).get("image_size", 224)
            # a full micro-batch on each of 2 ranks: the loader's last partial batch may be dropped
            counts = {"train": max(4, -(-2 * self.config.train.micro_batch_size // len(CLASSES))), "val": 2}
            out = build_once(
                stand_in_dir(root, "images", {"size": size, "classes": CLASSES, **counts}),
                ".framer_smoke_images_complete",
                lambda staging: _write_images(staging, size, counts),
                "synthetic ImageFolder",
            )
            found.overrides.append(f"data.source.path={out}")
            found.swapped.append(
                f"data.source.path: {data.source.path} is not on disk -> {out} (train/ and val/, "
                f"{len(CLASSES)} classes, {counts['train']} + {counts['val']} {size}x{size} JPEGs each)"
            )
        return found


def _save_tiny_vit(staging: Path, config: dict[str, Any]) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    small = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2, "intermediate_size": 64}
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(**{**fields, **small})).save_pretrained(staging)


def _write_images(staging: Path, size: int, counts: dict[str, int]) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in counts.items():
        for index, name in enumerate(CLASSES):
            folder = staging / split / name
            folder.mkdir(parents=True)
            for i in range(count):  # each class its own colour, with noise
                pixels = np.full((size, size, 3), 60 + 80 * index, dtype=np.int16)
                pixels += rng.integers(-40, 40, pixels.shape, dtype=np.int16)
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{name}_{i}.JPEG")
