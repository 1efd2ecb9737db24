"""`framer-ds smoke` for drivable_vit recipes (tasks/smoke.py says what a smoke keeps and swaps).

The model has no pretrained weights: its config is its architecture. The smoke keeps what shapes the
data path and the blocks' wiring (image size, patch, views, frames, ego motion, which frames are
segmented, the MLP ratio, the number of decoder stages) and shrinks width and depth: 32 wide in 2
heads, at most 2 blocks per stage (so a stage of several blocks still stacks them), 16 channels per
decoder stage. A manifest that is not on disk becomes the generated road set (synthetic_roads.py: three
cameras, masks, ego motion) at the model's image size and the recipe's frames, written as the file the
recipe names (JSON lines or Parquet, with its split column).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.drivable_vit.synthetic_roads import VIEWS, RoadSetOptions, write_road_set
from framer_ds.tasks.smoke import SmokeHooks, SmokeStandIns, stand_in_dir

WIDTH, HEADS, BLOCKS, DECODER = 32, 2, 2, 16
STAGES = ("spatial_layers", "cross_view_layers", "temporal_layers")


class DrivableSmoke(SmokeHooks):
    """The drivable_vit task's smoke hooks (a mixin of its task, which supplies `config`)."""

    config: Any

    def smoke_stand_ins(self, root: Path) -> SmokeStandIns:
        found = SmokeStandIns()
        model = self.config.model
        small = {"embed_dim": WIDTH, "num_heads": HEADS}
        small |= {stage: min(BLOCKS, getattr(model, stage)) for stage in STAGES}
        changed = {k: (getattr(model, k), v) for k, v in small.items() if getattr(model, k) != v}
        decoder = [DECODER] * len(model.decoder_channels)
        if decoder != list(model.decoder_channels):
            changed["decoder_channels"] = (list(model.decoder_channels), decoder)
        if changed:
            found.overrides += [f"model.{k}={json.dumps(new)}" for k, (_, new) in changed.items()]
            found.swapped.append(
                "model: a width- and depth-tiny random model of the recipe's architecture ("
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
                + "; image size, patch, views, frames, ego motion and segmented frames stay)"
            )
        self._smoke_manifest(root, found)
        return found

    def _smoke_manifest(self, root: Path, found: SmokeStandIns) -> None:
        data, model = self.config.data, self.config.model
        if data.source.path is None or Path(data.source.path).exists():
            return
        if tuple(data.views) != VIEWS or data.eval is not None:
            problem = (
                f"{data.source.path} is not on disk; the smoke generates cameras {', '.join(VIEWS)} in one "
                "manifest with a split column"
            )
            raise ConfigError([ConfigProblem("data.source.path", problem)], "smoke")
        options = RoadSetOptions(
            train_samples=4, eval_samples=2, frames=data.frames, image_size=model.image_size
        )
        name = Path(data.source.path).name
        folder = build_once(
            stand_in_dir(root, "roads", {"options": repr(options), "name": name, "split": data.split_column}),
            ".framer_smoke_roads_complete",
            lambda staging: _write_manifest(staging, options, name, data),
            "synthetic road set",
        )
        found.overrides.append(f"data.source.path={folder / name}")
        found.swapped.append(
            f"data.source.path: {data.source.path} is not on disk -> {folder / name} (the generated road "
            f"set: {options.train_samples} + {options.eval_samples} samples of {data.frames} frames from "
            f"{len(VIEWS)} cameras at {model.image_size} px)"
        )


def _write_manifest(staging: Path, options: RoadSetOptions, name: str, data: Any) -> None:
    """The road set, its manifest rewritten as `name` (Parquet or JSON lines) with the recipe's split
    column and values."""
    rows = [json.loads(line) for line in write_road_set(staging, options).read_text().splitlines()]
    (staging / "manifest.jsonl").unlink()
    splits = {"train": data.train_split, "val": data.eval_split}
    for row in rows:
        row[data.split_column] = splits[row.pop("split")]
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), staging / name)
    else:
        (staging / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
