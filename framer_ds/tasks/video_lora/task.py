"""The `video_lora` task: SVD fine-tuned with LoRA under the EDM objective SVD was trained with.

Only the UNet (with its LoRA) is trainable and goes through `prepare`; the VAE and CLIP image encoder
are frozen, built outside ZeRO-3 init, and kept on the device in the compute dtype.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace
from pathlib import Path

import torch

from framer_ds.config.errors import ConfigProblem
from framer_ds.data.digits import default_cache_dir
from framer_ds.data.synthetic_video import ensure_synthetic_clips
from framer_ds.data.video_clips import VideoClipDataset, validate_svd_size
from framer_ds.data.video_index import VideoIndex, build_video_index, format_report, require_usable
from framer_ds.diffusion import edm
from framer_ds.engine.accelerator import compute_dtype, frozen_model_init
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.video_lora.config import VideoLoraDataConfig, VideoLoraModelConfig
from framer_ds.tasks.video_lora.unet_lora import apply_lora, widen_conv_in

SVD_SUBFOLDERS = ("unet", "vae", "image_encoder")


def _svd():
    """diffusers' SVD pipeline module is imported only when a video run starts: registering the task
    (for `framer-ds tasks` / `validate`) stays light and prints no transformers warnings."""
    from framer_ds.diffusion import svd_conditioning

    return svd_conditioning


EXPORT_METADATA = "framer_ds_video_lora.json"


@register_task
class VideoLoraTask(Task):
    name = "video_lora"
    summary = (
        "LoRA fine-tuning of Stable Video Diffusion (image-to-video or first/last-frame interpolation, EDM)."
    )
    ModelConfig = VideoLoraModelConfig
    DataConfig = VideoLoraDataConfig

    def __init__(self, config):
        super().__init__(config)
        self.vae = None
        self.image_encoder = None
        self.unet_config = None

    # --- paths and pre-flight ------------------------------------------------------------------------

    def svd_path(self) -> Path:
        model = self.config.model
        return (
            default_cache_dir() / "tiny_svd" if model.builtin else Path(model.pretrained_model_name_or_path)
        )

    def data_root(self) -> Path:
        data = self.config.data
        return default_cache_dir() / "synthetic_clips" if data.builtin else Path(data.root)

    def min_frames(self) -> int:
        data = self.config.data
        return (data.num_frames - 1) * data.max_stride + 1

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
        return problems

    def prepare_data(self) -> None:
        if self.config.model.builtin == "tiny_svd":
            from framer_ds.diffusion.tiny_svd import create_tiny_svd

            create_tiny_svd(self.svd_path())
        if self.config.data.builtin == "synthetic_clips":
            ensure_synthetic_clips(self.data_root())

    # --- data ----------------------------------------------------------------------------------------

    def _index(self) -> VideoIndex:
        data = self.config.data
        index = build_video_index(
            self.data_root(), data.manifest, self.min_frames(), cache_dir=default_cache_dir() / "video_index"
        )
        require_usable(index, "data.root")
        return index

    def data_report(self) -> str:
        """Counts, durations, resolutions and every rejected file with its reason."""
        return format_report(self._index())

    def build_datasets(self):
        data = self.config.data
        index = self._index()
        records = sorted(index.records, key=lambda r: r.video_id)
        n_val = int(len(records) * data.val_fraction)
        # Every k-th video is held out: deterministic and spread over the whole folder.
        val_ids = {r.video_id for r in records[:: max(1, len(records) // n_val)][:n_val]} if n_val else set()
        common = {
            "num_frames": data.num_frames,
            "height": data.height,
            "width": data.width,
            "stride": data.stride,
            "stride_range": data.stride_range,
        }
        train_records = [r for r in records if r.video_id not in val_ids]
        train = VideoClipDataset(
            replace(index, records=train_records),
            hflip=data.hflip,
            random_crop=data.random_crop,
            train=True,
            **common,
        )
        if not val_ids:
            return train, None
        val = VideoClipDataset(
            replace(index, records=[r for r in records if r.video_id in val_ids]), train=False, **common
        )
        return train, val

    # --- models --------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        from diffusers import UNetSpatioTemporalConditionModel

        unet = UNetSpatioTemporalConditionModel.from_pretrained(self.svd_path(), subfolder="unet")
        interpolation = self.config.model.mode == "interpolation"
        if interpolation:
            widen_conv_in(unet)
        if self.config.train.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
        self.unet_config = unet
        return apply_lora(unet, self.config.model.lora, train_conv_in=interpolation)

    def setup_frozen(self, accelerator) -> None:
        from diffusers import AutoencoderKLTemporalDecoder
        from transformers import CLIPVisionModelWithProjection

        dtype = compute_dtype(accelerator)
        with frozen_model_init(accelerator):  # frozen helpers must not be partitioned by ZeRO-3
            vae = AutoencoderKLTemporalDecoder.from_pretrained(self.svd_path(), subfolder="vae")
            encoder = CLIPVisionModelWithProjection.from_pretrained(
                self.svd_path(), subfolder="image_encoder"
            )
        for module in (vae, encoder):
            module.requires_grad_(False).eval().to(accelerator.device, dtype=dtype)
        if self.config.model.vae_slicing:
            vae.enable_slicing()
        if self.config.model.vae_tiling and hasattr(vae, "enable_tiling"):
            vae.enable_tiling()
        self.vae, self.image_encoder = vae, encoder

    # --- objective -----------------------------------------------------------------------------------

    @torch.no_grad()
    def _condition(self, video: torch.Tensor, cond_sigma: torch.Tensor, generator=None):
        """(target latents, conditioning latents for the UNet, image embeddings) for one batch."""
        model = self.config.model
        first = video[:, 0]
        image_emb = _svd().clip_image_embeddings(self.image_encoder, first)
        first_lat = _svd().conditioning_latents(self.vae, first, cond_sigma, generator=generator)
        target = _svd().target_latents(
            self.vae, video, chunk_size=model.vae_chunk_size, sample=generator is None, generator=generator
        )
        if model.mode == "interpolation":
            last_lat = _svd().conditioning_latents(self.vae, video[:, -1], cond_sigma, generator=generator)
            cond, mask = _svd().interpolation_conditioning(first_lat, last_lat, video.shape[1])
            return target, (cond, mask), image_emb
        return target, (first_lat, None), image_emb

    def _denoise(self, model, noisy, sigma, cond, mask, image_emb, fps, cond_sigma) -> torch.Tensor:
        options = self.config.model
        fps_value = options.fps if options.fps is not None else fps.float()
        time_ids = _svd().added_time_ids(
            fps_value,
            options.motion_bucket_id,
            cond_sigma,
            noisy.shape[0],
            self.unet_config,
            device=noisy.device,
        )
        if mask is not None:
            cond = torch.cat([cond, mask.to(cond.dtype)], dim=2)
        return _svd().unet_denoise(model, noisy, sigma, cond, image_emb, time_ids)

    def training_loss(self, model, batch) -> torch.Tensor:
        video = batch["pixel_values"]
        options, batch_size, device = self.config.model, video.shape[0], video.device
        cond_sigma = edm.sample_cond_noise_sigma(
            batch_size, options.edm.cond_noise_mean, options.edm.cond_noise_std, device=device
        )
        target, (cond, mask), image_emb = self._condition(video, cond_sigma)
        image_emb, cond = _svd().conditioning_dropout(
            image_emb, cond, options.dropout_image, options.dropout_latents
        )
        sigma = edm.sample_sigmas(batch_size, options.edm.p_mean, options.edm.p_std, device=device)
        noisy = edm.add_noise(target.float(), sigma)
        denoised = self._denoise(model, noisy, sigma, cond, mask, image_emb, batch["fps"], cond_sigma)
        return edm.edm_loss(denoised, target.float(), sigma)

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Deterministic held-out loss at fixed sigma quantiles: the same noise for a given clip on any
        rank and at any step, so the curve moves only when the model does."""
        video = batch["pixel_values"]
        options, batch_size, device = self.config.model, video.shape[0], video.device
        seed = zlib.crc32("|".join(batch["video_id"]).encode())
        generator = torch.Generator(device=device).manual_seed(seed)
        cond_sigma = torch.full((batch_size,), math.exp(options.edm.cond_noise_mean), device=device)
        target, (cond, mask), image_emb = self._condition(video, cond_sigma, generator=generator)
        noise = torch.randn(target.shape, generator=generator, device=device, dtype=torch.float32)
        values: dict[str, torch.Tensor] = {}
        for sigma_value in edm.fixed_sigma_quantiles(
            options.edm.eval_sigmas, options.edm.p_mean, options.edm.p_std
        ):
            sigma = torch.full((batch_size,), float(sigma_value), device=device)
            noisy = target.float() + sigma.view(-1, 1, 1, 1, 1) * noise
            denoised = self._denoise(model, noisy, sigma, cond, mask, image_emb, batch["fps"], cond_sigma)
            values[f"loss_sigma_{float(sigma_value):.3g}"] = edm.edm_loss(
                denoised, target.float(), sigma, "none"
            )
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        return values

    # --- export --------------------------------------------------------------------------------------

    def checkpoint_artifacts(self, accelerator, model, checkpoint_dir: Path) -> None:
        """Each checkpoint carries a loadable adapter (`step_N/adapter/`), gathered under ZeRO-3."""
        adapter_dir = Path(checkpoint_dir) / "adapter"
        if accelerator.is_main_process:
            adapter_dir.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        self.export(accelerator, model, adapter_dir)

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
                "fps": options.fps,
                "motion_bucket_id": options.motion_bucket_id,
            }
            (Path(out_dir) / EXPORT_METADATA).write_text(json.dumps(metadata, indent=2))
