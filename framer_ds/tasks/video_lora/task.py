"""The `video_lora` task: SVD fine-tuned with LoRA under the EDM objective SVD was trained with.

Only the UNet (with its LoRA) is trainable and goes through `prepare`; the VAE and CLIP image encoder
are frozen, built outside ZeRO-3 init, and kept on the device in the compute dtype.
"""

from __future__ import annotations

import gc
import json
import math
import zlib
from pathlib import Path

import torch
from accelerate.utils import send_to_device
from torch.utils.data import Dataset, default_collate

from framer_ds.config.errors import ConfigProblem
from framer_ds.data.latent_cache import CachedEntryDataset, LatentCache, cache_key, fill_cache
from framer_ds.data.synthetic_video import ensure_synthetic_clips
from framer_ds.data.video_clips import (
    validate_svd_size,
)
from framer_ds.diffusion import edm
from framer_ds.engine.accelerator import frozen_model_init
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.precision import compute_dtype, to_compute_dtype
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.engine.rng import isolated_seed
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.video_lora.cache_fingerprints import source_fingerprint, weights_fingerprint
from framer_ds.tasks.video_lora.config import VideoLoraDataConfig, VideoLoraModelConfig
from framer_ds.tasks.video_lora.data_setup import VideoLoraData, layout_problems
from framer_ds.tasks.video_lora.encoding import EncodedClip, FrozenEncoders, encode_clips, encode_pairs
from framer_ds.tasks.video_lora.encoding import svd_conditioning as _svd
from framer_ds.tasks.video_lora.inference import (
    EXPORT_METADATA,
    VideoExportCommandOptions,
    VideoSampleCommandOptions,
    export_merged,
    sample_to_file,
    trained_fps_metadata,
)
from framer_ds.tasks.video_lora.unet_lora import apply_lora, widen_conv_in

SVD_SUBFOLDERS = ("unet", "vae", "image_encoder")


CACHE_FORMAT_VERSION = 1  # bump when the encoding changes what a cached entry holds


@register_task
class VideoLoraTask(Task):
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
        self.vae = None
        self.image_encoder = None
        self.unet_config = None
        self.accelerator = None
        self._raw_eval_or_train: Dataset | None = None  # pixel clips, for sampling inputs
        self._sample_inputs = None
        self._data_notes: dict[str, str] = {}
        self.trained_fps: list[float] = []  # the fps values training conditions on (model.fps null)

    # --- paths and pre-flight ------------------------------------------------------------------------

    def svd_path(self) -> Path:
        model = self.config.model
        return (
            default_cache_dir() / "tiny_svd" if model.builtin else Path(model.pretrained_model_name_or_path)
        )

    def data_root(self) -> Path:
        data = self.config.data
        return default_cache_dir() / "synthetic_clips" if data.builtin else Path(data.root)

    @property
    def uses_pairs(self) -> bool:
        return self.config.data.layout == "image_pairs"

    def check(self) -> list[ConfigProblem]:
        model, data = self.config.model, self.config.data
        problems = validate_svd_size(data.height, data.width)
        if model.builtin is None:
            missing = [s for s in SVD_SUBFOLDERS if not (self.svd_path() / s / "config.json").is_file()]
            if missing:
                problems.append(
                    ConfigProblem(
                        "model.pretrained_model_name_or_path",
                        f"{self.svd_path()} is not a diffusers SVD directory (missing {', '.join(missing)}/"
                        "config.json). Download it once, e.g. `huggingface-cli download "
                        "stabilityai/stable-video-diffusion-img2vid-xt --local-dir DIR`, and point this "
                        "key at DIR.",
                    )
                )
        if data.builtin is None and not self.data_root().is_dir():
            problems.append(
                ConfigProblem("data.root", f"{data.root} does not exist; point it at a video folder.")
            )
        model = self.config.model
        return problems + layout_problems(self.config.data, model.mode, model.fps)

    def prepare_data(self) -> None:
        if self.config.model.builtin == "tiny_svd":
            from framer_ds.diffusion.tiny_svd import create_tiny_svd

            create_tiny_svd(self.svd_path())
        if self.config.data.builtin == "synthetic_clips":
            ensure_synthetic_clips(self.data_root())

    # --- data ----------------------------------------------------------------------------------------

    def _data(self) -> VideoLoraData:
        return VideoLoraData(self.config.data, self.data_root(), self.config.model.fps)

    def data_report(self) -> str:
        """Counts, durations, resolutions, capped strides and every rejected file with its reason."""
        return self._data().report()

    def data_summary(self) -> dict[str, str]:
        return self._data_notes

    def build_datasets(self):
        built = self._data().build()
        self._data_notes, self.trained_fps = built.notes, built.conditioning_fps
        return built.train, built.val

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """The batch as the latent cache stores it (what the UNet sees), shaped from the config and the
        VAE's and image encoder's config.json. Without a cache training encodes pixels first under
        no_grad, in chunks: a transient this batch leaves out."""
        from diffusers import AutoencoderKLTemporalDecoder
        from transformers import CLIPVisionConfig

        vae = AutoencoderKLTemporalDecoder.load_config(self.svd_path(), subfolder="vae")
        embedding = CLIPVisionConfig.from_pretrained(
            self.svd_path(), subfolder="image_encoder"
        ).projection_dim
        data, k = self.config.data, micro_batch_size
        scale = 2 ** (len(vae["block_out_channels"]) - 1)
        latent = (vae["latent_channels"], data.height // scale, data.width // scale)
        batch = {
            "target": torch.zeros(k, data.num_frames, *latent),
            "first": torch.zeros(k, *latent),
            "image_emb": torch.zeros(k, 1, embedding),
            "cond_sigma": torch.full((k,), 0.02),
            "fps": torch.full((k,), float(self.config.model.fps or 7)),
        }
        if self.config.model.mode == "interpolation":
            batch["last"] = torch.zeros(k, *latent)
        if self.uses_pairs:
            batch["frame_weights"] = torch.ones(k, data.num_frames)
        return batch

    # --- models --------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        from diffusers import UNetSpatioTemporalConditionModel

        unet = load_pretrained(UNetSpatioTemporalConditionModel, self.svd_path(), subfolder="unet")
        interpolation = self.config.model.mode == "interpolation"
        if interpolation:
            widen_conv_in(unet)
        if self.config.train.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
        self.unet_config = unet
        return apply_lora(unet, self.config.model.lora, train_conv_in=interpolation)

    def setup_frozen(self, accelerator) -> None:
        """With the latent cache on, the VAE and encoder load only if the cache must be (re)built or
        samples drawn, and never stay on the device during training."""
        self.accelerator = accelerator
        if not self.config.data.cache.enabled:
            self._frozen_on_device()

    def frozen_helpers(self) -> list[torch.nn.Module]:
        """With the latent cache on they are on the device only to fill it and to draw samples."""
        return [] if self.config.data.cache.enabled else list(self._load_frozen())

    def _load_frozen(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        from diffusers import AutoencoderKLTemporalDecoder
        from transformers import CLIPVisionModelWithProjection

        vae = load_pretrained(AutoencoderKLTemporalDecoder, self.svd_path(), subfolder="vae")
        encoder = load_pretrained(CLIPVisionModelWithProjection, self.svd_path(), subfolder="image_encoder")
        return vae, encoder

    def _frozen_on_device(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        accelerator = self.accelerator
        if self.vae is None:
            with frozen_model_init(accelerator):  # frozen helpers must not be partitioned by ZeRO-3
                vae, encoder = self._load_frozen()
            for module in (vae, encoder):
                module.requires_grad_(False).eval()
            self.vae, self.image_encoder = vae, encoder
        dtype = compute_dtype(accelerator)
        for module, wanted in (
            (self.vae, _svd().vae_dtype(self.vae.config, dtype)),
            (self.image_encoder, dtype),
        ):
            module.to(accelerator.device)
            if module.dtype != wanted:  # diffusers warns on every dtype-carrying .to(), even a no-op
                module.to(dtype=wanted)
        return self.vae, self.image_encoder

    def _release_frozen(self) -> None:
        """Off the device: kept on CPU when sampling will want them again, else dropped."""
        if self.vae is None:
            return
        if self.config.model.samples.every:
            self.vae.to("cpu")
            self.image_encoder.to("cpu")
        else:
            self.vae = self.image_encoder = None
            gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # --- latent cache --------------------------------------------------------------------------------

    def precompute(self, accelerator, train_set, eval_set):
        """Pixel datasets -> cached latent datasets when `data.cache.enabled` (every rank)."""
        self._raw_eval_or_train = eval_set if eval_set is not None else train_set
        if not self.config.data.cache.enabled:
            return train_set, eval_set
        cached_train = self._cached(train_set, "train", self.config.data.cache.clips_per_video)
        cached_eval = self._cached(eval_set, "eval", 1) if eval_set is not None else None
        self._release_frozen()
        return cached_train, cached_eval

    def _cache_for(self, dataset: Dataset, split: str, copies: int) -> LatentCache:
        options, data = self.config.model, self.config.data
        described = {
            "format": CACHE_FORMAT_VERSION,
            "split": split,
            "copies": copies,
            "seed": self.config.train.seed,
            "source": source_fingerprint(dataset),
            "svd": weights_fingerprint(self.svd_path()),
            "dtype": str(compute_dtype(self.accelerator)),
            "mode": options.mode,
            "cond_noise": [options.edm.cond_noise_mean, options.edm.cond_noise_std],
            "vae_tile_size": options.vae_tile_size,
            "data": data.model_dump(mode="json", exclude={"cache", "val_fraction", "root", "builtin"}),
        }
        root = data.cache.dir or default_cache_dir() / "latent_cache"
        summary = {"split": split, "copies": copies, "videos": len(dataset), "svd": str(self.svd_path())}
        return LatentCache(root, cache_key(described), len(dataset) * copies, summary)

    def _cached(self, dataset: Dataset, split: str, copies: int) -> CachedEntryDataset:
        """Entry i is item i % n with its own RNG stream: training entries draw augmentation and the
        conditioning-noise strength as training would, eval entries use the fixed eval settings."""
        accelerator = self.accelerator
        cache = self._cache_for(dataset, split, copies)

        def encode(entry: int):
            if self.vae is None:  # loaded only when something is left to encode
                self._frozen_on_device()
            with isolated_seed(self.config.train.seed * 1_000_003 + entry):
                item = dataset[entry % len(dataset)]
                batch = send_to_device(default_collate([item]), accelerator.device)
                batch = to_compute_dtype(accelerator, batch, self.full_precision_keys)
                encoded = self._encode(batch, self._eval_generator(batch) if split == "eval" else None)
            return encoded.cache_entry(0), {"video_id": item["video_id"]}

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
        encoders = FrozenEncoders(self.vae, self.image_encoder, options.vae_chunk_size, options.vae_tile_size)
        if self.uses_pairs:
            fps = torch.full((pixels.shape[0],), float(options.fps), device=pixels.device)
            num_frames = self.config.data.num_frames
            return encode_pairs(encoders, pixels, num_frames, fps, cond_sigma, eval_generator)
        interpolation = options.mode == "interpolation"
        return encode_clips(encoders, pixels, batch["fps"], cond_sigma, interpolation, eval_generator)

    def _eval_generator(self, batch) -> torch.Generator:
        """The same noise for a given clip on any rank and at any step."""
        seed = zlib.crc32("|".join(batch["video_id"]).encode())
        return torch.Generator(device=self.accelerator.device).manual_seed(seed)

    def _denoise(self, model, noisy, sigma, encoded: EncodedClip, cond, mask, image_emb) -> torch.Tensor:
        options = self.config.model
        fps_value = options.fps if options.fps is not None else encoded.fps.float()
        time_ids = _svd().added_time_ids(
            fps_value,
            options.motion_bucket_id,
            encoded.cond_sigma.float(),
            noisy.shape[0],
            self.unet_config,
            device=noisy.device,
        )
        if mask is not None:
            cond = torch.cat([cond, mask.to(cond.dtype)], dim=2)
        return _svd().unet_denoise(model, noisy, sigma, cond, image_emb, time_ids)

    def training_loss(self, model, batch) -> torch.Tensor:
        options = self.config.model
        encoded = self._encode(batch)
        target = encoded.target.float()
        batch_size = target.shape[0]
        cond, mask = encoded.unet_conditioning(target.shape[1])
        image_emb, cond = _svd().conditioning_dropout(
            encoded.image_emb, cond, options.dropout_image, options.dropout_latents
        )
        sigma = edm.sample_sigmas(batch_size, options.edm.p_mean, options.edm.p_std, device=target.device)
        noisy = edm.add_noise(target, sigma)
        denoised = self._denoise(model, noisy, sigma, encoded, cond, mask, image_emb)
        return edm.edm_loss(denoised, target, sigma, frame_weights=encoded.frame_weights)

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Deterministic held-out loss at fixed sigma quantiles: the same noise for a given clip on any
        rank and at any step, so the curve moves only when the model does."""
        options = self.config.model
        generator = self._eval_generator(batch)
        encoded = self._encode(batch, generator)
        target = encoded.target.float()
        cond, mask = encoded.unet_conditioning(target.shape[1])
        noise = torch.randn(target.shape, generator=generator, device=target.device, dtype=torch.float32)
        values: dict[str, torch.Tensor] = {}
        for sigma_value in edm.fixed_sigma_quantiles(
            options.edm.eval_sigmas, options.edm.p_mean, options.edm.p_std
        ):
            sigma = torch.full((target.shape[0],), float(sigma_value), device=target.device)
            noisy = target + sigma.view(-1, 1, 1, 1, 1) * noise
            denoised = self._denoise(model, noisy, sigma, encoded, cond, mask, encoded.image_emb)
            values[f"loss_sigma_{float(sigma_value):.3g}"] = edm.edm_loss(
                denoised, target, sigma, "none", frame_weights=encoded.frame_weights
            )
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        return values

    # --- validation samples --------------------------------------------------------------------------

    def sample_every(self) -> int:
        return self.config.model.samples.every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """`model.samples.count` videos from held-out first (and last) frames, written under
        out_dir/step_N/; every rank takes part (ZeRO-3 forwards are collectives)."""
        from diffusers import EulerDiscreteScheduler

        from framer_ds.diffusion.sampling import SamplerParts
        from framer_ds.tasks.video_lora.validation_samples import collect_sample_inputs, write_sample_round

        options = self.config.model
        if self._sample_inputs is None:
            self._sample_inputs = collect_sample_inputs(
                self._raw_eval_or_train,
                options.samples,
                interpolation=options.mode == "interpolation",
                with_reference=not self.uses_pairs,
                fps=options.fps,
            )
        vae, encoder = self._frozen_on_device()
        scheduler = EulerDiscreteScheduler.from_pretrained(self.svd_path(), subfolder="scheduler")
        parts = SamplerParts(model, self.unet_config, vae, encoder, scheduler)
        was_training = model.training
        model.eval()
        try:
            return write_sample_round(
                accelerator,
                parts,
                self._sample_inputs,
                options.samples,
                self.config.data.num_frames,
                options.motion_bucket_id,
                Path(out_dir) / f"step_{step}",
                tile_size=options.vae_tile_size,
            )
        finally:
            model.train(was_training)
            if self.config.data.cache.enabled:
                self._release_frozen()

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
        save_peft_adapter_gathered(accelerator, model, out_dir)
        if accelerator.is_main_process:
            options, data = self.config.model, self.config.data
            metadata = {
                "base_model": str(self.svd_path()),
                "mode": options.mode,
                "conv_in_extra_channels": 1 if options.mode == "interpolation" else 0,
                "num_frames": data.num_frames,
                "height": data.height,
                "width": data.width,
                **trained_fps_metadata(options.fps, self.trained_fps),
                "motion_bucket_id": options.motion_bucket_id,
            }
            (Path(out_dir) / EXPORT_METADATA).write_text(json.dumps(metadata, indent=2))

    def sample(self, export_dir: Path, options: VideoSampleCommandOptions) -> str:
        """An mp4 from the adapter in `export_dir` (a run's final/ or a checkpoint's adapter/)."""
        return sample_to_file(export_dir, options)

    def export_command(self, export_dir: Path, options: VideoExportCommandOptions) -> str:
        """The base SVD with the adapter merged in: a diffusers pipeline (image-to-video) or UNet."""
        return export_merged(export_dir, options)
