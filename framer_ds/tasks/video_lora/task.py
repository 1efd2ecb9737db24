"""The `video_lora` task: SVD fine-tuned with LoRA under the EDM objective SVD was trained with.

Only the UNet (with its LoRA) is trainable and goes through `prepare`; the VAE and CLIP image encoder
are frozen, built outside ZeRO-3 init, and kept on the device in the compute dtype. Beside it: the
pre-flight (preflight.py), the latent cache (latent_caching.py) and the sampling during training
(training_samples.py).
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.base import Task
from framer_ds.tasks.planning import PlanningHooks
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.video_lora import framer_export  # noqa: F401  (registers --format framer)
from framer_ds.tasks.video_lora.bases import FramerBase
from framer_ds.tasks.video_lora.bucket_hooks import VideoBuckets
from framer_ds.tasks.video_lora.config import VideoLoraDataConfig, VideoLoraModelConfig
from framer_ds.tasks.video_lora.data.buckets import min_frames_for, size_multiple
from framer_ds.tasks.video_lora.data.synthetic_video import ensure_synthetic_clips
from framer_ds.tasks.video_lora.data_setup import VideoLoraData
from framer_ds.tasks.video_lora.diffusion import edm
from framer_ds.tasks.video_lora.diffusion.temporal_context import set_temporal_context_order
from framer_ds.tasks.video_lora.encoding import (
    EncodedClip,
    FrozenEncoders,
    encode_clips,
    encode_pairs,
    example_encoded_batch,
)
from framer_ds.tasks.video_lora.encoding import svd_conditioning as _svd
from framer_ds.tasks.video_lora.eval_memory import VideoEvalMemory, samples_during_training
from framer_ds.tasks.video_lora.export_formats import VideoExportCommandOptions, export_format
from framer_ds.tasks.video_lora.framer_setup import FramerSetup
from framer_ds.tasks.video_lora.frozen_encoders import FrozenSvdEncoders
from framer_ds.tasks.video_lora.inference import (
    EXPORT_METADATA,
    VideoSampleCommandOptions,
    export_metadata,
    sample_to_file,
)
from framer_ds.tasks.video_lora.interp_eval import lpips_note
from framer_ds.tasks.video_lora.latent_caching import VideoLatentCaching
from framer_ds.tasks.video_lora.preflight import config_problems
from framer_ds.tasks.video_lora.tracks_setup import build_tracks, with_controlnet_cond
from framer_ds.tasks.video_lora.training_samples import VideoTrainingSamples
from framer_ds.tasks.video_lora.unet_lora import build_svd_lora_unet


@register_task
class VideoLoraTask(
    VideoLatentCaching, VideoTrainingSamples, VideoEvalMemory, VideoBuckets, PlanningHooks, Task
):
    name = "video_lora"
    summary = (
        "LoRA fine-tuning of Stable Video Diffusion (image-to-video or first/last-frame interpolation, EDM)."
    )
    ModelConfig = VideoLoraModelConfig
    DataConfig = VideoLoraDataConfig
    full_precision_keys = frozenset({"fps", "cond_sigma"})  # added time ids; bf16 rounds 29.97 to 30
    sample_options = VideoSampleCommandOptions
    export_options = VideoExportCommandOptions

    def __init__(self, config):
        super().__init__(config)
        # the VAE and image encoder; idle on the CPU between sampling rounds when the latent cache is on
        self.frozen = FrozenSvdEncoders(self.svd_path(), keep_on_cpu=samples_during_training(config))
        # Kept on the task, unlike what one phase hands the next (an argument or a return value,
        # tasks/assemble.py): what the per-batch hooks (training_loss, eval_step, write_samples) need
        # and the loop does not pass them. The UNet's config (added-time ids) from build_model; the
        # run's accelerator from setup_frozen (the device, and where interp_eval brings the encoders).
        self.unet_config = None
        self.accelerator = None
        self._raw_eval_or_train: Dataset | None = None  # pixel clips, for sampling inputs
        self._sample_inputs = None
        self._data_notes: dict[str, str] = {}
        self.trained_fps: list[float] = []  # the fps values training conditions on (model.fps null)
        self.motion_buckets = None  # model.motion_bucket from_data: the training set's score quantiles
        self.init_buckets()  # data.buckets (bucket_hooks.py)
        # model.base.name framer: Framer's UNet + ControlNet and conventions (framer_setup.py)
        framer_base = isinstance(config.model.base, FramerBase)
        self.framer = FramerSetup(config.model, self.svd_path()) if framer_base else None

    # --- paths and pre-flight ------------------------------------------------------------------------

    def svd_path(self) -> Path:
        source = self.config.model.source
        return default_cache_dir() / "tiny_svd" if source.builtin else Path(source.path)

    def data_root(self) -> Path:
        source = self.config.data.source
        return default_cache_dir() / "synthetic_clips" if source.builtin else Path(source.path)

    @property
    def uses_pairs(self) -> bool:
        return self.config.data.layout == "image_pairs"

    def check(self) -> list[ConfigProblem]:
        return config_problems(self.config, self.svd_path(), self.data_root(), self.framer)

    def prepare_data(self) -> None:
        if self.config.model.source.builtin == "tiny_svd":
            from framer_ds.tasks.video_lora.models.tiny_svd import create_tiny_svd

            create_tiny_svd(self.svd_path())
        if self.framer is not None:
            self.framer.prepare()
        if self.config.data.source.builtin == "synthetic_clips":
            ensure_synthetic_clips(self.data_root())
        if self.config.model.motion_bucket == "from_data" and not self.uses_pairs:
            self._data().motion_rates()  # once per node, before the other ranks read the cache

    # --- data ----------------------------------------------------------------------------------------

    def _data(self) -> VideoLoraData:
        model = self.config.model
        return VideoLoraData(
            self.config.data,
            self.data_root(),
            model.fps,
            model.motion_bucket == "from_data",
            self.config.train.seed,
            size_multiple(self.svd_path(), model.source.builtin is not None),
            min_frames_for(model.base.mode),
        )

    def data_report(self) -> str:
        """Counts, durations, resolutions, capped strides and every rejected file with its reason."""
        return self._data().report()

    def data_summary(self) -> dict[str, str]:
        return self._data_notes

    def build_datasets(self):
        built = self._data().build()
        self._data_notes, self.trained_fps = built.notes, built.conditioning_fps
        self.motion_buckets = built.motion_buckets
        self.bucket_plan, self.item_buckets = built.buckets, built.item_buckets
        tracks = self.config.data.tracks
        if tracks is None:
            return built.train, built.val
        if tracks.tracker == "analytic":  # exact and cheap: no separate `data tracks` step needed
            build_tracks(self._data())
        seed = self.config.train.seed
        records = list(built.train.records) + list(built.val.records if built.val else [])
        return (
            with_controlnet_cond(built.train, records, tracks, seed),
            with_controlnet_cond(built.val, records, tracks, seed),
        )

    def compute_tracks(self, shard: tuple[int, int] = (0, 1)) -> str:
        """`framer-ds data tracks`: track every video once (resumable; `shard` = rank, world size of a
        launched run, each tracking its share); returns a summary."""
        if self.config.data.tracks is None:
            raise ConfigError([ConfigProblem("data.tracks", "not set: add a data.tracks section first.")])
        return build_tracks(self._data(), shard)

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """The batch as the latent cache stores it (what the UNet sees), shaped from the config and the
        VAE's and image encoder's config.json (`encoding.example_encoded_batch`)."""
        largest = self.largest_shape()[0]  # data.buckets: the largest bucket (bucket_hooks.py)
        shape = {"height": largest.height, "width": largest.width, "num_frames": largest.num_frames}
        config = self.config.model_copy(update={"data": self.config.data.model_copy(update=shape)})
        return example_encoded_batch(
            config, self.svd_path(), micro_batch_size, framer_base=self.framer is not None
        )

    # --- models --------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        checkpointing = self.config.train.gradient_checkpointing
        if self.framer is not None:
            model = self.framer.build_model(checkpointing)
            self.unet_config = self.framer.bare_unet  # config + added-time embedding, as for SVD
        else:
            self.unet_config, model = build_svd_lora_unet(self.svd_path(), self.config.model, checkpointing)
        # Framer's or diffusers' (diffusion/temporal_context.py), for both bases
        return set_temporal_context_order(model, self.config.model.context_order)

    def optimizer_groups(self, model: torch.nn.Module) -> list[dict] | None:
        """A Framer run's mask_token at `model.mask_token_lr` (framer_setup.py); otherwise one group."""
        return self.framer.optimizer_groups(model) if self.framer is not None else None

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        """The SVD UNet's repeated units (both bases build it): a res block and a spatio-temporal
        transformer, each one FSDP2 unit; a diffusers UNet has no `_no_split_modules` to go by."""
        present = {type(module).__name__ for module in model.modules()}
        return [
            name for name in ("SpatioTemporalResBlock", "TransformerSpatioTemporalModel") if name in present
        ]

    def setup_frozen(self, accelerator) -> None:
        """With the latent cache on, the VAE and encoder load only if the cache must be (re)built or
        samples drawn, and never stay on the device during training."""
        self.accelerator = accelerator
        if not self.config.data.cache.enabled:
            self.frozen.on_device(self.accelerator)
        if self.config.model.interp_eval.enabled:
            accelerator.print(lpips_note(self.config.model.interp_eval))

    def frozen_helpers(self) -> list[torch.nn.Module]:
        """With the latent cache on they are on the device only to fill it and to draw samples."""
        return [] if self.config.data.cache.enabled else list(self.frozen.load())

    def frozen_helpers_placement(self) -> str:
        """Where the VAE and image encoder are while training (after `precompute`)."""
        helpers = "VAE + image encoder"
        if not self.config.data.cache.enabled:
            return f"{helpers}: on the GPU all run, encoding every step (data.cache.enabled=true frees them)"
        later = "back only to draw samples" if samples_during_training(self.config) else "never back"
        if self.frozen.vae is None:
            off = "off the GPU (loaded only to fill the latent cache, not once complete)"
            return f"{helpers}: {off}, {later}"
        return f"{helpers}: on the GPU only while encoding the latent cache, now in CPU memory, {later}"

    # --- objective -----------------------------------------------------------------------------------

    def _train_cond_sigma(self, batch_size: int) -> torch.Tensor:
        edm_options = self.config.model.edm
        return edm.sample_cond_noise_sigma(
            batch_size,
            edm_options.cond_noise_mean,
            edm_options.cond_noise_std,
            device=self.accelerator.device,
        )

    def _encode(self, batch, eval_generator: torch.Generator | None = None) -> EncodedClip:
        """Conditioning for one batch: read from the cache, or encoded now by the frozen VAE + CLIP.

        Training draws the conditioning-noise strength; eval (`eval_generator`) uses its fixed value
        and takes every draw from the generator, which the caller goes on drawing the eval noise from.
        """
        if "target" in batch:
            return EncodedClip.from_cached_batch(batch)
        options, pixels = self.config.model, batch["pixel_values"]
        if eval_generator is None:
            cond_sigma = self._train_cond_sigma(pixels.shape[0])
        else:
            fixed = math.exp(options.edm.cond_noise_mean)
            cond_sigma = torch.full((pixels.shape[0],), fixed, device=pixels.device)
        encoders = FrozenEncoders(
            self.frozen.vae, self.frozen.image_encoder, options.vae_chunk_size, options.vae_tile_size
        )
        if self.uses_pairs:
            fps = torch.full((pixels.shape[0],), float(options.fps), device=pixels.device)
            num_frames = self.config.data.num_frames
            return encode_pairs(
                encoders, pixels, num_frames, fps, cond_sigma, eval_generator, self.framer is not None
            )
        interpolation, framer = options.base.mode == "interpolation", self.framer is not None
        return encode_clips(encoders, pixels, batch["fps"], cond_sigma, interpolation, eval_generator, framer)

    def _eval_generator(self, batch) -> list[torch.Generator]:
        """One generator per clip, seeded by its id: the same noise for a clip on any rank, at any step
        and whichever clips share its batch (a seed from the whole batch's ids made eval/loss depend on
        how the eval set was split between ranks). diffusers' `randn_tensor` takes such a list."""
        device = self.accelerator.device
        return [torch.Generator(device=device).manual_seed(zlib.crc32(v.encode())) for v in batch["video_id"]]

    def _denoise(
        self, model, noisy, sigma, encoded: EncodedClip, cond, mask, image_emb, controlnet_cond=None
    ) -> torch.Tensor:
        options = self.config.model
        fps_value = options.fps if options.fps is not None else encoded.fps.float()
        time_ids = _svd().added_time_ids(
            fps_value,
            encoded.motion_bucket.float()
            if encoded.motion_bucket is not None
            else options.fixed_motion_bucket,
            encoded.cond_sigma.float(),
            noisy.shape[0],
            self.unet_config,
            device=noisy.device,
        )
        if self.framer is not None:  # cond carries Framer's mask channel already
            return self.framer.denoise(model, noisy, sigma, cond, image_emb, time_ids, controlnet_cond)
        if mask is not None:
            cond = torch.cat([cond, mask.to(cond.dtype)], dim=2)
        return _svd().unet_denoise(model, noisy, sigma, cond, image_emb, time_ids)

    def training_loss(self, model, batch) -> torch.Tensor:
        options = self.config.model
        self.frozen.release_if_lent()  # interp_eval under the cache had them on the device
        self.note_trained_bucket(batch)
        encoded = self._encode(batch)
        encoded.motion_bucket = batch.get("motion_bucket_id", encoded.motion_bucket)  # else the cache's
        target = encoded.target.float()
        batch_size = target.shape[0]
        if self.framer is not None:
            (cond, image_emb), mask = self.framer.conditioning(encoded, target.shape[1], dropout=True), None
        else:
            cond, mask = encoded.unet_conditioning(target.shape[1])
            image_emb, cond = _svd().conditioning_dropout(
                encoded.image_emb, cond, options.dropout_image, options.dropout_latents
            )
        sigma = edm.sample_sigmas(batch_size, options.edm.p_mean, options.edm.p_std, device=target.device)
        noisy = edm.add_noise(target, sigma)
        tracks = batch.get("controlnet_cond")
        denoised = self._denoise(model, noisy, sigma, encoded, cond, mask, image_emb, tracks)
        return edm.edm_loss(denoised, target, sigma, frame_weights=encoded.frame_weights)

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Deterministic held-out loss at fixed sigma quantiles: the same noise for a given clip on any
        rank and at any step, so the curve moves only when the model does."""
        options = self.config.model
        generator = self._eval_generator(batch)
        encoded = self._encode(batch, generator)
        encoded.motion_bucket = batch.get("motion_bucket_id", encoded.motion_bucket)  # else the cache's
        target = encoded.target.float()
        cond, mask = encoded.unet_conditioning(target.shape[1])
        image_emb = encoded.image_emb
        if self.framer is not None:
            (cond, image_emb), mask = self.framer.conditioning(encoded, target.shape[1], dropout=False), None
        noise = torch.stack(
            [
                torch.randn(target.shape[1:], generator=g, device=target.device, dtype=torch.float32)
                for g in generator
            ]
        )
        values: dict[str, torch.Tensor] = {}
        for sigma_value in edm.fixed_sigma_quantiles(
            options.edm.eval_sigmas, options.edm.p_mean, options.edm.p_std
        ):
            sigma = torch.full((target.shape[0],), float(sigma_value), device=target.device)
            noisy = target + sigma.view(-1, 1, 1, 1, 1) * noise
            tracks = batch.get("controlnet_cond")
            denoised = self._denoise(model, noisy, sigma, encoded, cond, mask, image_emb, tracks)
            values[f"loss_sigma_{float(sigma_value):.3g}"] = edm.edm_loss(
                denoised, target, sigma, "none", frame_weights=encoded.frame_weights
            )
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        if options.interp_eval.enabled:
            values.update(self._interp_eval(model, batch))
        return values

    def summarize_eval(self, sums: dict[str, torch.Tensor], num_samples: int) -> dict[str, float]:
        """Per-clip means, and `eval/flicker_ratio` as a ratio of two totals (interp_metrics.py)."""
        from framer_ds.tasks.video_lora.metrics.interp_metrics import (
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
        """adapter_model.safetensors + adapter_config.json (peft; with conv_in for interpolation), and
        the conditioning settings a sampler needs."""
        framer = self.framer.export(accelerator, model, out_dir) if self.framer is not None else {}
        if self.framer is None:
            save_peft_adapter_gathered(accelerator, model, out_dir)
        if accelerator.is_main_process:
            metadata = export_metadata(self.config, self.svd_path(), self.trained_fps, self.motion_buckets)
            metadata["trained_shapes"] = self.trained_shapes()  # what `sample --height ...` accepts
            atomic_write_json(Path(out_dir) / EXPORT_METADATA, {**metadata, **framer})

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        """`framer-ds eval RUN`: the adapter of final/ or best/ into the model build_model made."""
        load = self.framer.load_export if self.framer is not None else load_peft_adapter
        load(model, Path(export_dir))
        return model

    def sample(self, export_dir: Path, options: VideoSampleCommandOptions) -> str:
        """An mp4 from the adapter in `export_dir` (a run's final/ or a checkpoint's adapter/)."""
        return sample_to_file(export_dir, options)

    def export_command(self, export_dir: Path, options: VideoExportCommandOptions) -> str:
        """`--format peft|merged|comfyui|framer` (`export_formats.EXPORT_FORMATS`)."""
        return export_format(export_dir, options)
