"""The mixins `VideoLoraTask` is built from, one concern each, every one needing the task's config, data,
base family and frozen encoders (which is why they are mixins, not functions):

- `VideoBuckets` (`data.buckets`): the training order (one bucket per step on every rank), the `bucket`
  each metrics line names, the shape the planner sizes memory by, and the shapes an export was trained at
  (`framer-ds sample --height/--width/--num-frames` accepts only those).
- `VideoLatentCaching`: pixel datasets -> cached latent datasets, filled once on every rank before
  training when `data.cache.enabled` (a phase of its own, before the first step), each entry encoded with
  the family's own conditioning and frozen encoders.
- `VideoTrainingSamples`: validation videos every `model.samples.every` steps and the interpolated frames
  `model.interp_eval` scores, through the family's sampler (a loop of its own: a scheduler, many
  denoiser calls, a decode; not a loss).
- `VideoEvalMemory`: what the evaluation phase puts on the device beyond the training step, for
  `framer-ds plan` (tasks/planning.py's `eval_only_helpers`, `helper_dtypes`, `eval_transient`). With the
  latent cache on, the VAE and the image encoder leave the device once the cache is filled and come back
  for every sample round and interp_eval: there the denoiser runs a guided batch without gradients and
  the VAE decodes `decode_chunk_size` frames at full resolution, beside the weights and optimizer states
  that stay resident. With gradient checkpointing that phase can be the run's peak: an out-of-memory at
  the first sample round, hours into the job, that a plan of the training step alone would not foresee.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import send_to_device
from torch.utils.data import Dataset, Sampler, default_collate

from framer_ds.config.errors import ConfigError
from framer_ds.data.item_draws import drawn_at_epoch
from framer_ds.engine.precision import compute_dtype, to_compute_dtype
from framer_ds.engine.rng import isolated_seed
from framer_ds.tasks.video_lora.shared.cache_key import latent_cache
from framer_ds.tasks.video_lora.shared.data.bucket_sampler import BucketBlockSampler
from framer_ds.tasks.video_lora.shared.data.buckets import Bucket, BucketPlan
from framer_ds.tasks.video_lora.shared.data.latent_cache import CachedEntryDataset, LatentCache, fill_cache
from framer_ds.tasks.video_lora.shared.interp_eval import with_eval_pixels
from framer_ds.tasks.video_lora.shared.options import samples_during_training


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


class VideoLatentCaching:
    """`precompute` and the cache it fills, mixed into `VideoLoraTask` (they need its config, frozen
    encoders, paths and `_encode`)."""

    def precompute(self, accelerator, train_set, eval_set):
        """Pixel datasets -> cached latent datasets when `data.cache.enabled` (every rank)."""
        self._raw_eval_or_train = eval_set if eval_set is not None else train_set
        if not self.config.data.cache.enabled:
            return train_set, eval_set
        cached_train = self._cached(accelerator, train_set, "train", self.config.data.cache.clips_per_video)
        cached_eval = self._cached(accelerator, eval_set, "eval", 1) if eval_set is not None else None
        self.frozen.release()
        self._cached_eval_or_train = cached_eval if cached_eval is not None else cached_train  # sampling
        # the videos the items come from: those of the datasets build_datasets returned (point tracks)
        records = [r for split in (train_set, eval_set) for r in getattr(split, "records", None) or []]
        cached_train, cached_eval = self.family.cached_datasets(cached_train, cached_eval, records)
        return cached_train, with_eval_pixels(cached_eval, eval_set, self.config)  # interp_eval's truth

    def _cache_for(self, accelerator, dataset: Dataset, split: str, copies: int) -> LatentCache:
        dtype = str(compute_dtype(accelerator))
        described = self.family.cache_description(dataset, split, copies, dtype)
        return latent_cache(self.config, dataset, split, copies, self.family.base_path(), described)

    def _cached(self, accelerator, dataset: Dataset, split: str, copies: int) -> CachedEntryDataset:
        """Entry i is item i % n: training entries draw augmentation and the conditioning-noise strength
        as training would, eval entries use the fixed eval settings. Copy k = i // n of a clip takes the
        augmentation epoch k would draw, and the noise strength from the entry's own seeded stream."""
        cache = self._cache_for(accelerator, dataset, split, copies)

        def encode(entry: int):
            if self.frozen.vae is None:  # loaded only when something is left to encode
                self.frozen.on_device(accelerator)
            copy, index = divmod(entry, len(dataset))
            with isolated_seed(self.config.train.seed * 1_000_003 + entry), drawn_at_epoch(dataset, copy):
                item = dataset[index]
                batch = send_to_device(default_collate([item]), accelerator.device)
                batch = to_compute_dtype(accelerator, batch, self.full_precision_keys)
                encoded = self._encode(batch, self._eval_generator(batch) if split == "eval" else None)
                entry = self.family.cache_entry(encoded, batch)  # + the family's own (SVD: motion bucket)
            # the clip placement (point tracks) and the bucket (data.buckets: the sampler's and the log's)
            extra = {key: item[key] for key in ("placement", "bucket") if key in item}
            return entry, {"video_id": item["video_id"], **extra}

        built = fill_cache(
            cache,
            encode,
            accelerator.process_index,
            accelerator.num_processes,
            accelerator.wait_for_everyone,
            accelerator.is_main_process,
        )
        accelerator.print(
            f"latent cache ({split}): {cache.size} clips in {cache.path}"
            + (f" ({built} encoded on rank 0)" if built else " (reused)")
        )
        return CachedEntryDataset(cache)


class VideoTrainingSamples:
    """`write_samples`, `sample_every` and interp_eval's sampling, mixed into `VideoLoraTask` (they need
    its config, base family, frozen encoders and the sampling inputs it keeps)."""

    def _interp_eval(self, model, batch) -> dict[str, torch.Tensor]:
        """`model.interp_eval` (`interp_eval.py`) with the base family's sampler; every rank calls it
        (ZeRO-3 collectives). Under the latent cache the encoders stay lent until the next step."""
        from framer_ds.tasks.video_lora.shared.interp_eval import interp_eval_batch

        self.frozen.lent = self.config.data.cache.enabled  # until the next training step
        return interp_eval_batch(self.family.training_sampler(model), batch, self.config.model)

    def sample_every(self) -> int:
        return self.config.model.samples.every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """`model.samples.count` videos from held-out first (and last) frames, written under
        out_dir/step_N/ by the base family's sampler; every rank takes part (ZeRO-3 forwards are
        collectives)."""
        from framer_ds.tasks.video_lora.shared.validation_samples import (
            collect_sample_inputs,
            write_sample_round,
        )

        options = self.config.model
        if self._sample_inputs is None:
            self._sample_inputs = collect_sample_inputs(
                self._raw_eval_or_train,
                options.samples,
                interpolation=options.base.mode == "interpolation",
                with_reference=not self.uses_pairs,
                fps=options.fps,
                cached=self._cached_eval_or_train,
            )
        sampler = self.family.training_sampler(model)
        was_training = model.training
        model.eval()
        try:
            return write_sample_round(
                accelerator,
                sampler,
                self._sample_inputs,
                options.samples,
                self.config.data.num_frames,
                Path(out_dir) / f"step_{step}",
            )
        finally:
            model.train(was_training)
            if self.config.data.cache.enabled:
                self.frozen.release()


def decode_chunk(config: Any) -> int:
    """The most frames one VAE decode call takes in any of those evaluations."""
    model, chunks = config.model, []
    if model.samples.every:
        chunks.append(model.samples.decode_chunk_size)
    if model.interp_eval.enabled:
        chunks.append(model.interp_eval.decode_chunk_size)
    return min(max(chunks, default=1), config.data.num_frames)


class VideoEvalMemory:
    """The evaluation-phase hooks of `VideoLoraTask` (mixed in: they need its config, frozen encoders and
    training loss)."""

    def eval_only_helpers(self) -> list[torch.nn.Module]:
        """The VAE and image encoder when the latent cache keeps them off the device in training and
        sampling brings them back; without the cache they are `frozen_helpers` already."""
        if self.config.data.cache.enabled and samples_during_training(self.config):
            return list(self.frozen.load())
        return []

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The dtypes the base family's `frozen.on_device` puts its helpers in (a VAE in float32)."""
        return self.family.helper_dtypes(helpers, compute)

    def eval_transient(self, model: torch.nn.Module, helpers: list[torch.nn.Module], batch: dict) -> None:
        """The denoiser on a guided batch (`batch` holds 2 clips: the conditional and unconditional
        halves of one sample) and the VAE decoding as the base family's sampler decodes."""
        if not samples_during_training(self.config) or not helpers:
            return
        with torch.no_grad():
            self.training_loss(model, batch)
            self.family.decode_transient(helpers[0], decode_chunk(self.config))
