"""The `video_lora` task: a LoRA on a video diffusion base, image-to-video or first/last-frame
interpolation.

The task runs what every base shares: the data (shared/data_setup.py), buckets, latent cache and
sampling plumbing (task_mixins.py), eval seeding. What a base family owns (its pre-flight, models,
encoding, objective, datasets' extras, export and sampler) comes from `self.family` (svd/ and framer/
under EDM, wan/ under rectified flow), chosen from `model.base.name` by families.py.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.base import Task
from framer_ds.tasks.planning import PlanningHooks
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.video_lora.config import (
    VideoLoraDataConfig,
    VideoLoraModelConfig,
    VideoSampleCommandOptions,
)
from framer_ds.tasks.video_lora.families import family_for
from framer_ds.tasks.video_lora.shared.data.synthetic_video import ensure_synthetic_clips
from framer_ds.tasks.video_lora.shared.data_setup import VideoLoraData, bucket_config_problems
from framer_ds.tasks.video_lora.shared.exports import VideoExportCommandOptions
from framer_ds.tasks.video_lora.shared.interp_eval import lpips_note
from framer_ds.tasks.video_lora.shared.options import samples_during_training
from framer_ds.tasks.video_lora.smoke import VideoLoraSmoke
from framer_ds.tasks.video_lora.task_mixins import (
    VideoBuckets,
    VideoEvalMemory,
    VideoLatentCaching,
    VideoTrainingSamples,
)


@register_task
class VideoLoraTask(
    VideoLatentCaching,
    VideoTrainingSamples,
    VideoEvalMemory,
    VideoBuckets,
    VideoLoraSmoke,
    PlanningHooks,
    Task,
):
    name = "video_lora"
    summary = (
        "LoRA fine-tuning of video diffusion bases: Stable Video Diffusion / Framer (EDM) and Wan 2.1 / "
        "2.2 (rectified flow); image-to-video or first/last-frame interpolation."
    )
    ModelConfig = VideoLoraModelConfig
    DataConfig = VideoLoraDataConfig
    full_precision_keys = frozenset({"fps", "cond_sigma"})  # added time ids; bf16 rounds 29.97 to 30
    sample_options = VideoSampleCommandOptions
    export_options = VideoExportCommandOptions

    def __init__(self, config):
        super().__init__(config)
        # the base family (models, encoding, objective, export, sampler): families.py, by model.base.name
        self.family = family_for(config)
        # Kept on the task, unlike what one phase hands the next (an argument or a return value,
        # tasks/assemble.py): what the per-batch hooks (training_loss, eval_step, write_samples) need
        # and the loop does not pass them. The run's accelerator from setup_frozen (the device, and
        # where interp_eval brings the encoders).
        self.accelerator = None
        self._raw_eval_or_train: Dataset | None = None  # pixel clips, for sampling inputs
        self._sample_inputs = None
        self._cached_eval_or_train: Dataset | None = None  # their latent cache (a Wan base's prompt states)
        self._data_notes: dict[str, str] = {}
        self.trained_fps: list[float] = []  # the fps values training conditions on (model.fps null)
        self.init_buckets()  # data.buckets (task_mixins.py)

    # --- paths and pre-flight ------------------------------------------------------------------------

    @property
    def frozen(self):
        """The base's frozen encoders (the latent cache, sampling and eval-memory hooks move them)."""
        return self.family.frozen

    def data_root(self) -> Path:
        source = self.config.data.source
        return default_cache_dir() / "synthetic_clips" if source.builtin else Path(source.path)

    @property
    def uses_pairs(self) -> bool:
        return self.config.data.layout == "image_pairs"

    def check(self) -> list[ConfigProblem]:
        """The base family's problems and data.buckets' by its rules, then those of the indexed videos it
        alone has (a missing caption file of a Wan run: read only when the rest is sound)."""
        problems = self.family.check(self.data_root()) + bucket_config_problems(self.config.data, self.family)
        return problems or self.family.record_problems(lambda: self._data().index().records)

    def prepare_data(self) -> None:
        self.family.prepare()
        if self.config.data.source.builtin == "synthetic_clips":
            ensure_synthetic_clips(self.data_root())
        self.family.prepare_data(self._data())  # once per node, before the other ranks read its caches

    # --- data ----------------------------------------------------------------------------------------

    def _data(self) -> VideoLoraData:
        return VideoLoraData(
            self.config.data,
            self.data_root(),
            self.config.model.fps,
            self.config.train.seed,
            self.family.size_multiple(),
            self.family.min_frames(),
            self.family.frame_grid(),
            self.family.clip_placement,
        )

    def data_report(self) -> str:
        """Counts, durations, resolutions, capped strides and every rejected file with its reason; a
        video the base cannot train on (a missing caption) is a ConfigError naming it."""
        data = self._data()
        problems = self.family.record_problems(lambda: data.index().records)
        if problems:
            raise ConfigError(problems, "data check")
        return data.report()

    def data_summary(self) -> dict[str, str]:
        return self._data_notes

    def build_datasets(self):
        data = self._data()
        built = data.build()
        self._data_notes, self.trained_fps = built.notes, built.conditioning_fps
        self.bucket_plan, self.item_buckets = built.buckets, built.item_buckets
        # the videos each clip comes from (image pairs have none): a Wan base reads their captions
        splits = (built.train, built.val)
        self.family.note_records([r for split in splits for r in getattr(split, "records", None) or []])
        return self.family.datasets(built, data)  # SVD's motion buckets, Framer's point heatmaps

    def compute_tracks(self, shard: tuple[int, int] = (0, 1)) -> str:
        """`framer-ds data tracks`: track every video once (resumable; `shard` = rank, world size of a
        launched run, each tracking its share); returns a summary."""
        if self.config.data.tracks is None:
            raise ConfigError([ConfigProblem("data.tracks", "not set: add a data.tracks section first.")])
        return self.family.compute_tracks(self._data(), shard)

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """The batch as the latent cache stores it (what the denoiser sees), of the largest bucket,
        shaped by the base family from the config and its components' config.json."""
        largest = self.largest_shape()[0]  # data.buckets: the largest bucket (task_mixins.py)
        shape = {"height": largest.height, "width": largest.width, "num_frames": largest.num_frames}
        config = self.config.model_copy(update={"data": self.config.data.model_copy(update=shape)})
        return self.family.example_batch(config, micro_batch_size)

    # --- models --------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        return self.family.build_model(self.config.train.gradient_checkpointing)

    def optimizer_groups(self, model: torch.nn.Module) -> list[dict] | None:
        return self.family.optimizer_groups(model)

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        return self.family.fsdp_block_classes(model)

    def setup_frozen(self, accelerator) -> None:
        """With the latent cache on, the VAE and encoder load only if the cache must be (re)built or
        samples drawn, and never stay on the device during training."""
        self.accelerator = self.family.accelerator = accelerator
        if not self.config.data.cache.enabled:
            self.frozen.on_device(self.accelerator)
        if self.config.model.interp_eval.enabled:
            accelerator.print(lpips_note(self.config.model.interp_eval))

    def frozen_helpers(self) -> list[torch.nn.Module]:
        """With the latent cache on they are on the device only to fill it and to draw samples."""
        return [] if self.config.data.cache.enabled else list(self.frozen.load())

    def frozen_helpers_placement(self) -> str:
        """Where the base's frozen encoders are while training (after `precompute`)."""
        helpers = self.family.frozen_helper_names
        if not self.config.data.cache.enabled:
            return f"{helpers}: on the GPU all run, encoding every step (data.cache.enabled=true frees them)"
        later = "back only to draw samples" if samples_during_training(self.config) else "never back"
        if self.frozen.vae is None:
            off = "off the GPU (loaded only to fill the latent cache, not once complete)"
            return f"{helpers}: {off}, {later}"
        return f"{helpers}: on the GPU only while encoding the latent cache, now in CPU memory, {later}"

    # --- objective -----------------------------------------------------------------------------------

    def _encode(self, batch, eval_generator: list[torch.Generator] | None = None):
        """The base family's encoding of a batch (read from the cache, or encoded now)."""
        return self.family.encode(batch, eval_generator)

    def _eval_generator(self, batch) -> list[torch.Generator]:
        """One generator per clip, seeded by its id: the same noise for a clip on any rank, at any step
        and whichever clips share its batch (a seed from the whole batch's ids made eval/loss depend on
        how the eval set was split between ranks). diffusers' `randn_tensor` takes such a list."""
        device = self.accelerator.device
        return [torch.Generator(device=device).manual_seed(zlib.crc32(v.encode())) for v in batch["video_id"]]

    def training_loss(self, model, batch) -> torch.Tensor:
        self.frozen.release_if_lent()  # interp_eval under the cache had them on the device
        self.note_trained_bucket(batch)
        return self.family.training_loss(model, batch)

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Deterministic held-out loss at fixed noise levels: the same noise for a given clip on any
        rank and at any step, so the curve moves only when the model does."""
        values = self.family.eval_losses(model, batch, self._eval_generator(batch))
        if self.config.model.interp_eval.enabled:
            values.update(self._interp_eval(model, batch))
        return values

    def summarize_eval(self, sums: dict[str, torch.Tensor], num_samples: int) -> dict[str, float]:
        """Per-clip means, and `eval/flicker_ratio` as a ratio of two totals (interp_metrics.py)."""
        from framer_ds.tasks.video_lora.shared.interp_metrics import (
            INTERP_METRIC_KEYS,
            summarize_interp_metrics,
        )

        rest = {k: v for k, v in sums.items() if k not in INTERP_METRIC_KEYS}
        return {**super().summarize_eval(rest, num_samples), **summarize_interp_metrics(sums, num_samples)}

    # --- export --------------------------------------------------------------------------------------

    def checkpoint_artifacts(self, accelerator, model, checkpoint_dir: Path) -> None:
        """Each checkpoint carries a loadable adapter (`step_N/adapter/`), gathered under ZeRO-3."""
        adapter_dir = Path(checkpoint_dir) / "adapter"
        if accelerator.is_main_process:
            adapter_dir.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        self.export_with_record(accelerator, model, adapter_dir)

    def export(self, accelerator, model, out_dir: Path) -> None:
        """The base family's adapter and metadata, with what the data taught the run."""
        facts = {"trained_fps": self.trained_fps, "trained_shapes": self.trained_shapes()}
        self.family.export(accelerator, model, out_dir, facts)

    def export_record_fields(self) -> dict[str, Any]:
        """`base_model`: the diffusers folder the adapter loads into (its base family's), + the family's
        own facts (a Wan 2.2 expert and its boundary)."""
        return {"base_model": str(self.family.base_path()), **self.family.export_record_fields()}

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        """`framer-ds eval RUN`: the adapter of final/ or best/ into the model build_model made."""
        return self.family.load_export(model, Path(export_dir))

    def sample(self, export_dir: Path, options: VideoSampleCommandOptions) -> str:
        """A video from the adapter in `export_dir` (a run's final/ or a checkpoint's adapter/)."""
        return self.family.sample(export_dir, options)

    def export_command(self, export_dir: Path, options: VideoExportCommandOptions) -> str:
        """`framer-ds export --format ...` of the base family."""
        return self.family.export_command(export_dir, options)
