"""The SVD family: stock Stable Video Diffusion (`model.base.name: svd`), an SVD UNet trained under EDM
with the frozen SVD VAE and CLIP image encoder.

Framer (`FramerFamily`) is this family extended one way: it overrides the steps marked "hook" below
(its model, conditioning, denoiser call, datasets, export, sampler parts) and this module never names
it, as finetrainers' Wan control specification extends its base specification.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA, ExportFormat, export_format
from framer_ds.tasks.video_lora.shared.options import samples_during_training
from framer_ds.tasks.video_lora.shared.protocol import VideoBaseFamily, per_clip_noise
from framer_ds.tasks.video_lora.svd import edm
from framer_ds.tasks.video_lora.svd.clip_sampler import SvdClipSampler
from framer_ds.tasks.video_lora.svd.encoding import (
    EncodedClip,
    FrozenEncoders,
    describe_cache,
    encode_clips,
    encode_pairs,
    example_encoded_batch,
)
from framer_ds.tasks.video_lora.svd.encoding import svd_conditioning as _svd
from framer_ds.tasks.video_lora.svd.export import (
    SVD_EXPORT_FORMATS,
    export_metadata,
    no_record_fields,
    sample_to_file,
    svd_sampler_parts,
)
from framer_ds.tasks.video_lora.svd.frozen_encoders import FrozenSvdEncoders
from framer_ds.tasks.video_lora.svd.motion import data_motion_rates, with_motion_buckets
from framer_ds.tasks.video_lora.svd.options import SvdSampleFlags
from framer_ds.tasks.video_lora.svd.preflight import config_problems, tracks_unused
from framer_ds.tasks.video_lora.svd.temporal_context import set_temporal_context_order
from framer_ds.tasks.video_lora.svd.unet import MASK_CHANNELS, build_svd_lora_unet

SVD_SIZE_MULTIPLE = 64  # SVD's VAE downsamples by 8 and its UNet by 8 more
TINY_SIZE_MULTIPLE = 16  # the built-in tiny SVD: VAE /8, a UNet of two down blocks /2


class SvdFamily(VideoBaseFamily):
    """Stock SVD: EDM on the SVD UNet; the base of `FramerFamily`."""

    embeds_last_frame = False
    """Whether a clip's conditioning holds the last frame's CLIP embedding too (Framer's convention)."""
    sample_flags: tuple[type, ...] = (SvdSampleFlags,)
    """The `framer-ds sample` flag groups this base's exports take (another family's are refused)."""

    def __init__(self, config: Any):
        super().__init__(config)
        # the VAE and image encoder; idle on the CPU between sampling rounds when the latent cache is on
        self._frozen = FrozenSvdEncoders(self.base_path(), keep_on_cpu=samples_during_training(config))
        self.unet_config = None  # the UNet's config (added-time ids), from build_model
        self.motion_buckets = None  # model.motion_bucket from_data: the training set's score quantiles

    @property
    def frozen(self) -> FrozenSvdEncoders:
        return self._frozen

    def base_path(self) -> Path:
        source = self.config.model.source
        return default_cache_dir() / "tiny_svd" if source.builtin else Path(source.path)

    svd_path = base_path  # the name the SVD code and its tests use

    @property
    def uses_pairs(self) -> bool:
        return self.config.data.layout == "image_pairs"

    def prepare(self) -> None:
        if self.config.model.source.builtin == "tiny_svd":
            from framer_ds.tasks.video_lora.svd.tiny import create_tiny_svd

            create_tiny_svd(self.base_path())

    def prepare_data(self, data: Any) -> None:
        """model.motion_bucket from_data: every video's motion score, once per node before the other
        ranks read the cache (`VideoLoraData.motion_rates`)."""
        if self.motion_from_data:
            data_motion_rates(data)

    @property
    def motion_from_data(self) -> bool:
        """model.motion_bucket from_data on videos (image pairs have no motion to score)."""
        return self.config.model.motion_bucket == "from_data" and not self.uses_pairs

    def datasets(self, built: Any, data: Any) -> tuple[Dataset, Dataset | None]:
        """With model.motion_bucket from_data each item carries its clip's bucket (svd/motion.py)."""
        if self.motion_from_data:
            self.motion_buckets = with_motion_buckets(built, data)
        return built.train, built.val

    def check(self, data_root: Path) -> list[ConfigProblem]:
        return config_problems(
            self.config, self.base_path(), data_root, self.base_problems(), self.track_problems()
        )

    def base_problems(self) -> list[ConfigProblem]:
        """Hook: the problems of the base's own files and keys beyond SVD's (Framer's checkpoint)."""
        return []

    def track_problems(self) -> list[ConfigProblem]:
        """Hook: data.tracks on a base without a trajectory ControlNet is refused (nothing reads it)."""
        return tracks_unused(self.config.data)

    def size_multiple(self) -> int:
        """The VAE's downsampling times the UNet's (2 per down block but the last), read from the
        model's config.json files; before a folder exists, the built-in tiny model's or SVD's."""
        try:
            vae = json.loads((self.base_path() / "vae" / "config.json").read_text())
            unet = json.loads((self.base_path() / "unet" / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return TINY_SIZE_MULTIPLE if self.config.model.source.builtin is not None else SVD_SIZE_MULTIPLE
        return 2 ** (len(vae["block_out_channels"]) - 1) * 2 ** (len(unet["down_block_types"]) - 1)

    def min_frames(self) -> int:
        """Interpolation needs a frame between its two ends; image-to-video one after the first."""
        return 3 if self.config.model.base.mode == "interpolation" else 2

    # --- models --------------------------------------------------------------------------------------

    def build_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        self.unet_config, model = self._build_unet(gradient_checkpointing)
        # the base's temporal context order (svd/temporal_context.py), Framer's too
        return set_temporal_context_order(model, self.config.model.context_order)

    def _build_unet(self, gradient_checkpointing: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        """Hook: (the bare UNet, whose config and added-time embedding describe the time ids; the model
        that trains)."""
        return build_svd_lora_unet(self.base_path(), self.config.model, gradient_checkpointing)

    def conv_in_extra_channels(self) -> int:
        """Hook: the input channels `_build_unet` adds to the base UNet's conv_in (the interpolation mask
        on stock SVD, `svd/unet.widen_conv_in`), which a sampler adds again before loading the adapter."""
        return MASK_CHANNELS if self.config.model.base.mode == "interpolation" else 0

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        """The SVD UNet's repeated units (both bases build it): a res block and a spatio-temporal
        transformer, each one FSDP2 unit; a diffusers UNet has no `_no_split_modules` to go by."""
        present = {type(module).__name__ for module in model.modules()}
        return [
            name for name in ("SpatioTemporalResBlock", "TransformerSpatioTemporalModel") if name in present
        ]

    # --- objective -----------------------------------------------------------------------------------

    def _train_cond_sigma(self, batch_size: int) -> torch.Tensor:
        edm_options = self.config.model.edm
        return edm.sample_cond_noise_sigma(
            batch_size,
            edm_options.cond_noise_mean,
            edm_options.cond_noise_std,
            device=self.accelerator.device,
        )

    def encode(self, batch, eval_generator: list[torch.Generator] | None = None) -> EncodedClip:
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
        last = self.embeds_last_frame
        if self.uses_pairs:
            fps = torch.full((pixels.shape[0],), float(options.fps), device=pixels.device)
            num_frames = self.config.data.num_frames
            return encode_pairs(encoders, pixels, num_frames, fps, cond_sigma, eval_generator, last)
        interpolation = options.base.mode == "interpolation"
        return encode_clips(encoders, pixels, batch["fps"], cond_sigma, interpolation, eval_generator, last)

    def _denoise(self, model, noisy, sigma, encoded: EncodedClip, cond, image_emb, batch) -> torch.Tensor:
        """The EDM denoiser on `noisy` at `sigma`, conditioned as the clip was encoded."""
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
        return self._unet_denoise(model, noisy, sigma, cond, image_emb, time_ids, batch)

    def _unet_denoise(self, model, noisy, sigma, cond, image_emb, time_ids, batch) -> torch.Tensor:
        """Hook: the UNet call itself (Framer's goes through its ControlNet on the batch's heatmaps)."""
        return _svd().unet_denoise(model, noisy, sigma, cond, image_emb, time_ids)

    def _conditioning(
        self, encoded: EncodedClip, num_frames: int, dropout: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook: (conditioning latents [B,F,C(+1),h,w] with the interpolation mask channel appended,
        image embeddings), with classifier-free-guidance dropout when training (`dropout`): the mask
        is never dropped (CFG drops content, not layout)."""
        cond, mask = encoded.unet_conditioning(num_frames)
        image_emb = encoded.image_emb
        if dropout:
            options = self.config.model
            image_emb, cond = _svd().conditioning_dropout(
                image_emb, cond, options.dropout_image, options.dropout_latents
            )
        if mask is not None:
            cond = torch.cat([cond, mask.to(cond.dtype)], dim=2)
        return cond, image_emb

    def training_loss(self, model, batch) -> torch.Tensor:
        options = self.config.model
        encoded = self.encode(batch)
        encoded.motion_bucket = batch.get("motion_bucket_id", encoded.motion_bucket)  # else the cache's
        target = encoded.target.float()
        batch_size = target.shape[0]
        cond, image_emb = self._conditioning(encoded, target.shape[1], dropout=True)
        sigma = edm.sample_sigmas(batch_size, options.edm.p_mean, options.edm.p_std, device=target.device)
        noisy = edm.add_noise(target, sigma)
        denoised = self._denoise(model, noisy, sigma, encoded, cond, image_emb, batch)
        return edm.edm_loss(denoised, target, sigma, frame_weights=encoded.frame_weights)

    def eval_losses(self, model, batch, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        """EDM losses at fixed sigma quantiles, the noise drawn from each clip's own generator."""
        options = self.config.model
        encoded = self.encode(batch, generators)
        encoded.motion_bucket = batch.get("motion_bucket_id", encoded.motion_bucket)  # else the cache's
        target = encoded.target.float()
        cond, image_emb = self._conditioning(encoded, target.shape[1], dropout=False)
        noise = per_clip_noise(target, generators)
        values: dict[str, torch.Tensor] = {}
        for sigma_value in edm.fixed_sigma_quantiles(
            options.edm.eval_sigmas, options.edm.p_mean, options.edm.p_std
        ):
            sigma = torch.full((target.shape[0],), float(sigma_value), device=target.device)
            noisy = target + sigma.view(-1, 1, 1, 1, 1) * noise
            denoised = self._denoise(model, noisy, sigma, encoded, cond, image_emb, batch)
            values[f"loss_sigma_{float(sigma_value):.3g}"] = edm.edm_loss(
                denoised, target, sigma, "none", frame_weights=encoded.frame_weights
            )
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        return values

    def cache_entry(self, encoded: EncodedClip, batch: dict) -> dict[str, torch.Tensor]:
        """from_data: the entry stores the clip's bucket, which training prefers to the fixed one."""
        encoded.motion_bucket = batch.get("motion_bucket_id")
        return encoded.cache_entry(0)

    def cache_description(self, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
        return describe_cache(self.config, dataset, split, copies, self.base_path(), dtype)

    def example_batch(self, config: Any, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """From the VAE's and image encoder's config.json (`encoding.example_encoded_batch`)."""
        return example_encoded_batch(config, self.base_path(), micro_batch_size, self.embeds_last_frame)

    # --- sampling the model being trained -------------------------------------------------------------

    def training_sampler(self, model: torch.nn.Module) -> SvdClipSampler:
        """The model with the frozen VAE and encoder on the device and the base's Euler scheduler."""
        from diffusers import EulerDiscreteScheduler

        from framer_ds.tasks.video_lora.svd.sampling import SamplerParts

        vae, encoder = self.frozen.on_device(self.accelerator)
        scheduler = EulerDiscreteScheduler.from_pretrained(self.base_path(), subfolder="scheduler")
        parts = SamplerParts(model, self.unet_config, vae, encoder, scheduler)
        options = self.config.model
        return SvdClipSampler(
            parts, options.vae_tile_size, self.sampling_source(), options.fixed_motion_bucket
        )

    def sampling_source(self) -> Any:
        """Hook: what gives a clip's `SamplingConditioning` (an object with `sampling(controlnet_cond)`);
        None: SVD's own conditioning."""
        return None

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The VAE in the dtype SVD's VAE tolerates (fp32 under fp16 with force_upcast), as
        `FrozenSvdEncoders.on_device` puts it; the image encoder in the compute dtype."""
        return [_svd().vae_dtype(helpers[0].config, compute), compute] if helpers else []

    def decode_transient(self, vae: torch.nn.Module, chunk: int) -> None:
        """One chunk of `chunk` frames at full size (`diffusion/sampling.decode_latents`)."""
        from framer_ds.tasks.video_lora.svd.sampling import decode_latents

        scale = 2 ** (len(vae.config.block_out_channels) - 1)
        data = self.config.data
        latents = torch.zeros(
            1, chunk, vae.config.latent_channels, data.height // scale, data.width // scale,
            device=next(vae.parameters()).device, dtype=vae.dtype,
        )  # fmt: skip
        decode_latents(vae, latents, chunk, chunk)

    # --- export and sampling -------------------------------------------------------------------------

    def export(self, accelerator, model, out_dir: Path, run_facts: dict[str, Any]) -> None:
        """adapter_model.safetensors + adapter_config.json (peft; with conv_in for interpolation), and
        the conditioning settings a sampler needs."""
        extra = self._export_weights(accelerator, model, out_dir)
        if accelerator.is_main_process:
            facts = run_facts["trained_fps"], self.motion_buckets, self.conv_in_extra_channels()
            metadata = export_metadata(self.config, self.base_path(), *facts)
            metadata["trained_shapes"] = run_facts["trained_shapes"]  # what `sample --height ...` accepts
            atomic_write_json(Path(out_dir) / EXPORT_METADATA, {**metadata, **extra})

    def _export_weights(self, accelerator, model, out_dir: Path) -> dict[str, Any]:
        """Hook: write the trained weights (every rank: ZeRO-3 gathers); returns metadata entries."""
        save_peft_adapter_gathered(accelerator, model, out_dir)
        return {}

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        load_peft_adapter(model, Path(export_dir))
        return model

    def sample(self, export_dir: Path, options: Any) -> str:
        hooks = self.sampler_parts, self.sample_flags, self.sample_record_fields
        return sample_to_file(export_dir, options, *hooks)

    def sample_record_fields(
        self, metadata: dict[str, Any], options: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Hook: (settings, base folders) this base adds to `framer-ds sample`'s record (Framer's tracks
        file and its checkpoint directory); stock SVD adds none."""
        return no_record_fields(metadata, options)

    def sampler_parts(
        self,
        adapter_dir: Path,
        metadata: dict[str, Any],
        options: Any,
        num_frames: int,
        device: str,
        dtype: torch.dtype,
    ):
        """Hook: (SamplerParts, SamplingConditioning or None) of an export: stock SVD's pipeline with
        the adapter merged."""
        return svd_sampler_parts(adapter_dir, metadata, options, num_frames, device, dtype)

    def export_formats(self) -> dict[str, ExportFormat]:
        """Hook: `framer-ds export --format` name -> writer, for this base."""
        return dict(SVD_EXPORT_FORMATS)

    def export_command(self, export_dir: Path, options: Any) -> str:
        return export_format(export_dir, options, self.export_formats())

    # --- `framer-ds smoke` ---------------------------------------------------------------------------

    def smoke_bases(self) -> list[tuple[str, Any, Any, str]]:
        """The SVD directory (model.source.path), when the config names one."""
        from framer_ds.tasks.video_lora.svd.smoke_base import create_smoke_svd

        path = self.config.model.source.path
        return [] if path is None else [("model.source.path", path, create_smoke_svd, "SVD")]

    def smoke_export_format(self) -> str:
        """ComfyUI's keys for image-to-video; the merged UNet for interpolation (ComfyUI's format does
        not carry it)."""
        return "merged" if self.config.model.base.mode == "interpolation" else "comfyui"

    def smoke_sample_flags(self, samples: Any, caption: str) -> list[str]:
        """SVD's sampler settings of the recipe's samples."""
        return [
            "--min-guidance", str(samples.min_guidance_scale),
            "--max-guidance", str(samples.max_guidance_scale),
            "--guidance-schedule", samples.guidance_schedule,
            "--noise-aug", str(samples.noise_aug_strength),
            "--decode-chunk-size", str(samples.decode_chunk_size),
        ]  # fmt: skip
