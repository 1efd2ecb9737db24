"""The `drivable_vit` task: drivable-space segmentation from several cameras over several frames with a
spatial -> cross-view -> temporal ViT (docs/drivable_vit.md).

The loss is BCE (+ optional soft Dice, + optional auxiliary heads) per micro-batch; evaluation returns
per-sample pixel counts that the loop sums over every rank, so `eval/iou` (and each class's IoU) is
summed intersections over summed unions at any number of processes. Overlays of fixed validation samples
are the task's media.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from framer_ds.config.errors import ConfigProblem
from framer_ds.engine.export import save_module_gathered
from framer_ds.engine.export_load import load_full_export
from framer_ds.engine.precision import to_compute_dtype
from framer_ds.tasks.base import Task
from framer_ds.tasks.drivable_vit.config import DrivableDataConfig, DrivableModelConfig
from framer_ds.tasks.drivable_vit.data_setup import DrivableData, SplitSamples
from framer_ds.tasks.drivable_vit.inference import (
    WEIGHTS,
    DrivableSampleOptions,
    sample_command,
    write_record,
)
from framer_ds.tasks.drivable_vit.losses import (
    auxiliary_losses,
    eval_counts,
    per_class_table,
    segmentation_loss,
    summarize_counts,
)
from framer_ds.tasks.drivable_vit.model import Block, DrivableViT
from framer_ds.tasks.drivable_vit.multiview_manifest import EGO_MOTION_DIM, EgoStatistics
from framer_ds.tasks.drivable_vit.overlays import write_overlays
from framer_ds.tasks.drivable_vit.smoke import DrivableSmoke
from framer_ds.tasks.planning import PlanningHooks
from framer_ds.tasks.registry import register_task


@register_task
class DrivableVitTask(DrivableSmoke, PlanningHooks, Task):
    name = "drivable_vit"
    summary = "Drivable-space segmentation from several cameras x frames (spatial, cross-view, temporal ViT)."
    ModelConfig = DrivableModelConfig
    DataConfig = DrivableDataConfig
    full_precision_keys = frozenset({"masks"})
    sample_options = DrivableSampleOptions

    def __init__(self, config):
        super().__init__(config)
        self.ego_statistics: EgoStatistics | None = None
        self._split: SplitSamples | None = None
        self._eval_set = None

    @cached_property
    def data(self) -> DrivableData:
        return DrivableData(self.config)

    # --- pre-flight and data -------------------------------------------------------------------------

    def check(self) -> list[ConfigProblem]:
        problems = self.data.file_problems()
        model, data = self.config.model, self.config.data
        if model.aux.next_frame_weight > 0 and data.frames < 2:
            problems.append(
                ConfigProblem(
                    "model.aux.next_frame_weight", "needs data.frames >= 2 (a next frame to predict)"
                )
            )
        return problems

    def prepare_data(self) -> None:
        self.data.ensure_builtin()

    def prepare_model_assets(self) -> None:
        """The model is built from its config alone: `framer-ds plan` reads no data."""
        return None

    def _load(self, files: str = "config") -> SplitSamples:
        split = self.data.load(files)
        self._split = split
        self.ego_statistics = EgoStatistics.of(split.train) if self.config.model.ego_motion else None
        return split

    def build_datasets(self):
        split = self._load()
        train, evaluation = self.data.datasets(split, self.ego_statistics)
        self._eval_set = evaluation
        return train, evaluation

    def data_summary(self) -> dict:
        notes = dict(self._split.notes) if self._split else {}
        if self.ego_statistics is not None:
            notes["ego motion mean"] = [round(x, 4) for x in self.ego_statistics.mean]
            notes["ego motion std"] = [round(x, 4) for x in self.ego_statistics.std]
        return notes

    def data_report(self) -> str:
        """Every image and mask is decoded: unreadable files, wrong mask sizes or values are listed."""
        split = self._load(files="decode")
        data = self.config.data
        lines = [
            f"train: {len(split.train)} samples; validation: {len(split.eval)} samples "
            f"({split.notes['validation']})",
            f"views {data.views} x {data.frames} frames; masks for "
            f"{'the last frame' if self.config.model.segment_frames == 'last' else 'every frame'}; "
            "all files decode",
        ]
        for name, samples in (("train", split.train), ("validation", split.eval)):
            if samples:
                share = road_share(samples)
                lines.append(
                    f"{name} road pixels: {share:.1%} (all-road baseline: IoU {share:.3f}, accuracy "
                    f"{share:.3f}; all-background: IoU 0, accuracy {1 - share:.3f})"
                )
        lines += [f"{key}: {value}" for key, value in self.data_summary().items() if key != "validation"]
        return "\n".join(lines)

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """Every sample has the same shapes, all from the config: no data is read."""
        model, data = self.config.model, self.config.data
        views, frames, size = len(data.views), data.frames, model.image_size
        labelled = frames if model.segment_frames == "all" else 1
        batch = {
            "pixel_values": torch.zeros(micro_batch_size, frames, views, 3, size, size),
            "masks": torch.zeros(micro_batch_size, labelled, views, size, size),
        }
        if model.ego_motion:
            batch["ego_motion"] = torch.zeros(micro_batch_size, frames, EGO_MOTION_DIM)
        return batch

    # --- model and objective -------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        data = self.config.data
        model = DrivableViT(self.config.model, views=len(data.views), frames=data.frames)
        model.set_gradient_checkpointing(self.config.train.gradient_checkpointing)
        return model

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        """Every spatial, cross-view and temporal layer is a `Block`: one FSDP2 unit each."""
        return [Block.__name__]

    def _aux_on(self) -> bool:
        aux = self.config.model.aux
        return aux.masked_patch_weight > 0 or aux.next_frame_weight > 0 or aux.cross_view_weight > 0

    def training_loss(self, model, batch) -> torch.Tensor:
        with_aux = self._aux_on()
        outputs = model(batch["pixel_values"], batch.get("ego_motion"), with_aux=with_aux)
        loss = segmentation_loss(outputs["logits"], batch["masks"], self.config.model.dice_weight)
        if with_aux:
            loss = loss + sum(auxiliary_losses(outputs, batch["pixel_values"], self.config.model).values())
        return loss

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        logits = model(batch["pixel_values"], batch.get("ego_motion"))["logits"]
        return eval_counts(logits, batch["masks"])

    def summarize_eval(self, sums, num_samples: int) -> dict[str, float]:
        return summarize_counts(sums, self.config.model.dice_weight)

    def eval_details(self, sums, num_samples: int) -> dict:
        return {"per_class": per_class_table(sums)}

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        """final/'s gathered `model.safetensors` into the model `build_model` made: `framer-ds eval`."""
        load_full_export(model, export_dir, WEIGHTS)
        return model

    # --- overlays and export -------------------------------------------------------------------------

    def sample_every(self) -> int:
        """`model.samples.every`, or else the evaluation's cadence when it is given in steps."""
        every = self.config.model.samples.every
        if every is not None:
            return every
        evaluation = self.config.train.eval.every
        return (evaluation.steps or 0) if evaluation is not None else 0

    @torch.no_grad()
    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """Overlays of the first `model.samples.count` validation samples: samples/step_N/<id>.png.
        Every rank runs the same forward (a ZeRO-3 collective); rank 0 writes."""
        if self._eval_set is None or len(self._eval_set) == 0:
            return []
        count = min(self.config.model.samples.count, len(self._eval_set))
        items = [self._eval_set[i] for i in range(count)]
        batch = {k: v.to(accelerator.device) for k, v in default_collate(items).items()}
        batch = to_compute_dtype(accelerator, batch, self.full_precision_keys)
        was_training = model.training
        model.eval()
        try:
            logits = model(batch["pixel_values"], batch.get("ego_motion"))["logits"]
        finally:
            model.train(was_training)
        if not accelerator.is_main_process:
            return []
        names = [self._eval_set.samples[i].sample_id for i in range(count)]
        data = self.config.data
        return write_overlays(
            items, logits.cpu(), names, Path(out_dir) / f"step_{step}", tuple(data.mean), tuple(data.std)
        )

    def export(self, accelerator, model, out_dir: Path) -> None:
        """`model.safetensors` (gathered on every rank, written by rank 0) and `drivable_vit.json`."""
        save_module_gathered(accelerator, model, Path(out_dir) / WEIGHTS)
        if accelerator.is_main_process:
            write_record(out_dir, self.config, self.ego_statistics)

    def sample(self, export_dir: Path, options: DrivableSampleOptions) -> str:
        return sample_command(export_dir, options)


def road_share(samples) -> float:
    """Share of road pixels over every labelled mask of `samples` (at their file resolution)."""
    road = total = 0
    for sample in samples:
        for paths in sample.masks.values():
            for path in paths:
                with Image.open(path) as mask:
                    values = np.asarray(mask.convert("L")) > 0
                road, total = road + int(values.sum()), total + values.size
    return road / max(total, 1)
