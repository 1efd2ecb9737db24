"""The latent-cache hooks of `VideoLoraTask`: pixel datasets -> cached latent datasets, filled once on
every rank before training when `data.cache.enabled`.

Why a mixin (as eval_memory.VideoEvalMemory): filling the cache encodes each clip with the task's own
conditioning (`_encode`, `_eval_generator`) and frozen encoders, so these methods need the task; they
live apart from the objective because they are a phase of their own, run before the first step.
"""

from __future__ import annotations

from accelerate.utils import send_to_device
from torch.utils.data import Dataset, default_collate

from framer_ds.data.item_draws import drawn_at_epoch
from framer_ds.engine.precision import compute_dtype, to_compute_dtype
from framer_ds.engine.rng import isolated_seed
from framer_ds.tasks.video_lora.cache_fingerprints import latent_cache
from framer_ds.tasks.video_lora.data.latent_cache import CachedEntryDataset, LatentCache, fill_cache
from framer_ds.tasks.video_lora.interp_eval import with_eval_pixels


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
