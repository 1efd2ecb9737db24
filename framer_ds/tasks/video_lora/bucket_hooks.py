"""The `data.buckets` hooks of `VideoLoraTask`: the training order (one bucket per step on every rank),
the `bucket` each metrics line names, the shape the planner sizes memory by, and the shapes an export
was trained at (`framer-ds sample --height/--width/--num-frames` accepts only those).

Why a mixin (as latent_caching.VideoLatentCaching): these hooks read the task's config, its data and
the plan `build_datasets` made, and are a concern of their own across training, planning and export.
"""

from __future__ import annotations

from typing import Any

from accelerate import PartialState
from torch.utils.data import Dataset, Sampler

from framer_ds.config.errors import ConfigError
from framer_ds.tasks.video_lora.data.bucket_sampler import BucketBlockSampler
from framer_ds.tasks.video_lora.data.buckets import Bucket, BucketPlan


class VideoBuckets:
    """Mixed into `VideoLoraTask`; `build_datasets` sets `bucket_plan` and `item_buckets`."""

    def init_buckets(self) -> None:
        self.bucket_plan: BucketPlan | None = None
        self.item_buckets: list[str] = []  # each training item's bucket, by index of the built training set
        self._trained_buckets: set[str] = set()  # buckets of the micro-batches since the last metrics line

    def train_sampler(self, train_set: Dataset) -> Sampler | None:
        """With buckets: blocks of world size x micro-batch indices from one bucket (bucket_sampler.py).
        Entry i of a latent cache holding k copies of each clip is clip i % n, so it keeps that bucket."""
        if self.bucket_plan is None:
            return None
        n = len(self.item_buckets)
        names = [self.item_buckets[i % n] for i in range(len(train_set))]
        world = (
            self.accelerator.num_processes if self.accelerator is not None else PartialState().num_processes
        )
        train = self.config.train
        return BucketBlockSampler(names, train.micro_batch_size, world, train.seed)

    def note_trained_bucket(self, batch: dict[str, Any]) -> None:
        """Called by `training_loss`: every item of a micro-batch is of one bucket."""
        if "bucket" in batch:
            self._trained_buckets.add(batch["bucket"][0])

    def log_labels(self) -> dict[str, str]:
        """`bucket` of the steps since the last metrics line (every rank trains the same one per step;
        several joined by commas when a line covers steps of several buckets)."""
        seen = sorted(self._trained_buckets)
        self._trained_buckets = set()
        return {"bucket": ",".join(seen)} if seen else {}

    def largest_shape(self) -> tuple[Bucket, str]:
        """The shape the planner sizes activations by and why: the largest bucket (frames x pixels), or
        the one configured shape. `auto` reads the clips; without them, the configured shape is assumed."""
        data = self.config.data
        configured = Bucket(data.height, data.width, data.num_frames)
        if data.buckets is None:
            return configured, ""
        if data.buckets != "auto":
            shapes = [Bucket.parse(text) for text in data.buckets]
            largest = max(shapes, key=lambda b: (b.volume, b.name))
            return (
                largest,
                f"memory sized by the largest bucket {largest.name} of {len(shapes)} (data.buckets)",
            )
        try:
            found = self._data().index()
            plan = self._data().bucket_plan(found.records)
        except (ConfigError, OSError) as exc:
            return configured, f"data.buckets auto: clips not readable ({exc}); assumed {configured.name}"
        largest = plan.largest()
        names = ", ".join(b.name for b in plan.buckets)
        return largest, f"memory sized by the largest bucket {largest.name} of auto's {names} (data.buckets)"

    def plan_assumptions(self) -> list[str]:
        line = self.largest_shape()[1]
        return [line] if line else []

    def trained_shapes(self) -> list[list[int]]:
        """[[height, width, num_frames], ...] the export was trained at (its metadata)."""
        if self.bucket_plan is None:
            data = self.config.data
            return [[data.height, data.width, data.num_frames]]
        return [
            [b.height, b.width, b.num_frames] for b in self.bucket_plan.buckets if b.name in self.item_buckets
        ]
