"""The Wan family: Wan 2.1 image-to-video (I2V) and first-last-frame (FLF2V) bases, and Wan 2.2's
two-expert I2V bases, under rectified flow, through diffusers' own classes (`WanTransformer3DModel`,
`AutoencoderKLWan`, UMT5, CLIP vision where the base has it).

Wan 2.2 (transformer/ = the high-noise expert, transformer_2/ = the low-noise one, switched at the
folder's boundary_ratio): a run trains ONE expert (`model.base.expert`), as musubi-tuner and
diffusion-pipe do, on the training table's entries of that expert's range only; the other transformer
is never loaded. `framer-ds sample` runs both, as the pipeline does (wan/export.py).

Wan 2.2 TI2V-5B (model_index.json `expand_timesteps`): one transformer on Wan 2.2's 16x VAE, given the
first frame as its latents (no CLIP, no mask channels): the noisy clip's first latent frame is replaced
by the image's latent at timestep 0 and left out of the loss (wan/ti2v.py).

What it encodes is exactly what diffusers' `WanImageToVideoPipeline` feeds the transformer (wan/
conditioning.py): the normalised video latents (the target), the frame mask + latents of the given
frames (the condition), CLIP's penultimate states of the given frames (bases with an image encoder) and
the UMT5 prompt states. All are cached, so with a complete latent cache no encoder, UMT5 included, is
ever loaded. The loss is flow matching in diffusers' scheduler conventions (wan/flow_matching.py);
export and sampling are in wan/export.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.cache_key import cache_basics, files_fingerprint
from framer_ds.tasks.video_lora.shared.captions import CaptionedClips
from framer_ds.tasks.video_lora.shared.protocol import VideoBaseFamily, per_clip_noise
from framer_ds.tasks.video_lora.wan import flow_matching as fm
from framer_ds.tasks.video_lora.wan.encoders import FrozenWanEncoders, WanEncodedClip
from framer_ds.tasks.video_lora.wan.export import WanExports
from framer_ds.tasks.video_lora.wan.preflight import (
    EXPERT_SUBFOLDERS,
    TINY_TI2V_BUILTINS,
    TINY_TWO_EXPERT_BUILTINS,
    expands_timesteps,
    frame_count_problem,
    model_index,
    vae_temporal_factor,
    wan_problems,
)

ENCODER_FOLDERS = ("vae", "image_encoder", "image_processor", "text_encoder", "tokenizer")
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default; the cached prompt states have this length


class WanFamily(CaptionedClips, WanExports, VideoBaseFamily):
    """Wan bases (`model.base.name: wan`): LoRA on the DiT, the rest frozen."""

    def __init__(self, config: Any):
        super().__init__(config)
        self._frozen = FrozenWanEncoders(self.base_path())
        self._negative: torch.Tensor | None = None  # the negative prompt's UMT5 states, once a run

    @property
    def frozen(self) -> FrozenWanEncoders:
        return self._frozen

    @property
    def frozen_helper_names(self) -> str:  # type: ignore[override]
        """The run summary's name of the frozen encoders (no CLIP on Wan 2.2 I2V A14B)."""
        image = " + CLIP image encoder" if self.frozen.with_image_encoder else ""
        return f"VAE{image} + UMT5 text encoder"

    def transformer_subfolder(self) -> str:
        """The transformer this run trains: `transformer`, or the expert's on a two-expert base."""
        expert = self.config.model.base.expert
        return "transformer" if expert is None else EXPERT_SUBFOLDERS[expert]

    def boundary_ratio(self) -> float | None:
        """Where a two-expert base's experts hand over: model.base.boundary_ratio, else the folder's."""
        base = self.config.model.base
        if base.expert is None:
            return None
        return base.boundary_ratio or float(model_index(self.base_path())["boundary_ratio"])

    def _expert_range(self) -> tuple[int, int] | None:
        """The training table's index range of the run's expert (None: every entry)."""
        ratio = self.boundary_ratio()
        if ratio is None:
            return None
        return fm.expert_index_range(self.shift(), ratio, self.config.model.base.expert)

    def base_path(self) -> Path:
        source = self.config.model.base.source
        return default_cache_dir() / source.builtin if source.builtin else Path(source.path)

    def _folder_config(self, sub: str, name: str = "config.json") -> dict[str, Any]:
        return json.loads((self.base_path() / sub / name).read_text())

    def prepare(self) -> None:
        builtin = self.config.model.base.source.builtin
        if builtin is not None:
            from framer_ds.tasks.video_lora.wan.tiny import create_tiny_wan

            modes = {"tiny_wan_flf2v": "flf2v", "tiny_wan_i2v": "i2v"}
            modes.update(dict.fromkeys(TINY_TWO_EXPERT_BUILTINS, "wan22_i2v"))
            modes.update(dict.fromkeys(TINY_TI2V_BUILTINS, "wan22_ti2v"))
            create_tiny_wan(self.base_path(), mode=modes[builtin])

    def check(self, data_root: Path) -> list[ConfigProblem]:
        frames = self.frame_count_problem(self.config.data.num_frames)
        return wan_problems(self.config, self.base_path(), data_root, self.size_multiple(), frames)

    @property
    def expand_timesteps(self) -> bool:
        """Wan 2.2 TI2V-5B: the first latent frame given, per-token timesteps (wan/ti2v.py)."""
        builtin = self.config.model.base.source.builtin
        return builtin in TINY_TI2V_BUILTINS or (builtin is None and expands_timesteps(self.base_path()))

    def size_multiple(self) -> int:
        """The VAE's spatial compression times the transformer's patch (8 x 2 in Wan 2.1, 16 x 2 in
        TI2V-5B); the same before a built-in base is built."""
        try:
            spatial = self._folder_config("vae")["scale_factor_spatial"]
            return spatial * self._folder_config(self.transformer_subfolder())["patch_size"][1]
        except (OSError, ValueError, KeyError):
            return 32 if self.expand_timesteps else 16

    def temporal_factor(self) -> int:
        """Pixel frames per latent frame after the first (4 in Wan 2.1)."""
        return vae_temporal_factor(self.base_path())

    def min_frames(self) -> int:
        return 1 + self.temporal_factor()

    def frame_count_problem(self, num_frames: int) -> str | None:
        """Wan's VAE encodes the first frame alone and then `temporal_factor` frames per latent frame."""
        return frame_count_problem(num_frames, self.temporal_factor())

    def frame_grid(self) -> tuple[int, int]:
        """Auto buckets' lengths are the VAE's: 1 + k * temporal_factor (5, 9, 13, ... in Wan 2.1)."""
        return 1, self.temporal_factor()

    def shift(self) -> float:
        """model.base.shift, else the folder's scheduler config (the pipeline samples with it)."""
        if self.config.model.base.shift is not None:
            return self.config.model.base.shift
        from framer_ds.tasks.video_lora.wan.sampling import scheduler_shift

        return scheduler_shift(self._folder_config("scheduler", "scheduler_config.json"))

    # --- models --------------------------------------------------------------------------------------

    def build_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        """The transformer (the expert's on a two-expert base; the other is not loaded), frozen, with a
        peft LoRA on `WAN_LORA_TARGETS` (or model.lora.target_modules when the config names others than
        the default)."""
        from diffusers import WanTransformer3DModel
        from peft import LoraConfig, get_peft_model

        from framer_ds.tasks.video_lora.wan.lora_layout import WAN_LORA_TARGETS

        folder = self.transformer_subfolder()
        transformer = load_pretrained(WanTransformer3DModel, self.base_path(), subfolder=folder)
        transformer.requires_grad_(False)
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        lora = self.config.model.lora
        # the SVD default (attention names) means "the base's own"; a resolved config dumps every key,
        # so the value, not whether it was set, tells a user's choice apart
        default = type(lora).model_fields["target_modules"].get_default(call_default_factory=True)
        named = lora.target_modules != default or lora.include_feed_forward or lora.include_projections
        targets = lora.targets() if named else list(WAN_LORA_TARGETS)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=targets,
            init_lora_weights=lora.peft_init(),
        )
        return get_peft_model(transformer, config)

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        return ["WanTransformerBlock"]

    # --- objective -----------------------------------------------------------------------------------

    def encode(self, batch, eval_generator: list[torch.Generator] | None = None) -> WanEncodedClip:
        """Read back from the cache, or encoded now exactly as the pipeline encodes (deterministic: the
        VAE's mode for the target as for the condition, so eval and training encode alike)."""
        if "target" in batch:
            return WanEncodedClip.from_cached_batch(batch)
        from framer_ds.tasks.video_lora.wan import conditioning as wan

        frozen, pixels = self.frozen, batch["pixel_values"]  # [B, T, 3, H, W] in [-1, 1]
        first, last = pixels[:, 0], pixels[:, -1] if self.interpolation else None
        num_frames = pixels.shape[1]
        prompts = [self.prompts[video_id] for video_id in batch["video_id"]]
        images = frozen.encode_images(first, last)
        if self.expand_timesteps:
            from framer_ds.tasks.video_lora.wan.ti2v import first_frame_latents

            condition = first_frame_latents(frozen.vae, first)
        else:
            condition = wan.condition_latents(frozen.vae, first, last, num_frames)
        return WanEncodedClip(
            target=wan.encode_video_latents(frozen.vae, pixels.transpose(1, 2)),
            condition=condition,
            image_emb=None if images is None else images.view(pixels.shape[0], -1, *images.shape[1:]),
            prompt_emb=wan.encode_prompts(
                frozen.text_encoder, frozen.tokenizer, prompts, MAX_SEQUENCE_LENGTH
            ),
        )

    @property
    def interpolation(self) -> bool:
        return self.config.model.base.mode == "interpolation"

    def velocity(
        self, model, noisy: torch.Tensor, sigmas: torch.Tensor, encoded: WanEncodedClip
    ) -> torch.Tensor:
        """The transformer's velocity for noisy latents at `sigmas`, inputs cast to its dtype as the
        pipeline casts them; TI2V: the first latent frame replaced by the image's, its tokens at
        timestep 0 (wan/ti2v.py)."""
        from framer_ds.tasks.video_lora.wan import ti2v

        dtype = next(model.parameters()).dtype
        image = encoded.image_tokens()
        timesteps = fm.sigmas_to_timesteps(sigmas)
        if self.expand_timesteps:
            mask = ti2v.first_frame_mask(*noisy.shape[2:], device=noisy.device)
            hidden = ti2v.model_input(noisy, encoded.condition, mask)
            timesteps = ti2v.token_timesteps(mask, timesteps)
        else:
            hidden = torch.cat([noisy, encoded.condition.to(noisy)], dim=1)
        return model(
            hidden_states=hidden.to(dtype),
            timestep=timesteps,
            encoder_hidden_states=encoded.prompt_emb.to(dtype),
            encoder_hidden_states_image=None if image is None else image.to(dtype),
            return_dict=False,
        )[0]

    def _loss_at(
        self, model, encoded: WanEncodedClip, noise: torch.Tensor, sigmas: torch.Tensor, reduce=True
    ):
        x0 = encoded.target.float()
        prediction = self.velocity(model, fm.noisy_latents(x0, noise, sigmas), sigmas, encoded)
        target = fm.flow_target(x0, noise)
        if self.expand_timesteps:  # TI2V: the first frame is given, not denoised (wan/ti2v.py)
            prediction, target = prediction[:, :, 1:], target[:, :, 1:]
        weights = fm.loss_weights(sigmas, self.config.model.base.loss_weighting)
        if reduce:
            return fm.flow_matching_loss(prediction, target, weights)
        squared = (prediction.float() - target).pow(2).flatten(1).mean(dim=1)
        return weights.float() * squared

    def training_loss(self, model, batch) -> torch.Tensor:
        base = self.config.model.base
        encoded = self.encode(batch)
        x0 = encoded.target.float()
        sigmas = fm.sample_training_sigmas(
            x0.shape[0],
            self.shift(),
            base.timestep_sampling,
            base.logit_mean,
            base.logit_std,
            index_range=self._expert_range(),
        ).to(x0.device)
        return self._loss_at(model, encoded, torch.randn_like(x0), sigmas)

    def eval_sigmas(self) -> list[float]:
        """The training table's entries at the quantiles (i + 0.5) / n of the run's range (the expert's
        on a two-expert base): fixed noise levels spread as uniform training sampling spreads them."""
        n, table = self.config.model.base.eval_sigmas, fm.training_sigma_table(self.shift())
        lo, hi = self._expert_range() or (0, len(table))
        return [float(table[lo + int((i + 0.5) / n * (hi - lo))]) for i in range(n)]

    def eval_losses(self, model, batch, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        """Per-clip flow-matching losses at fixed sigmas, the noise from each clip's own generator."""
        encoded = self.encode(batch, generators)
        noise = per_clip_noise(encoded.target, generators)
        values: dict[str, torch.Tensor] = {}
        for sigma in self.eval_sigmas():
            sigmas = torch.full((noise.shape[0],), sigma, device=noise.device)
            values[f"loss_sigma_{sigma:.3g}"] = self._loss_at(model, encoded, noise, sigmas, reduce=False)
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        return values

    # --- sampling the model being trained -------------------------------------------------------------

    def training_sampler(self, model: torch.nn.Module):
        """`WanClipSampler` (wan/clip_sampler.py): the model with the frozen encoders on the device, the
        folder's scheduler and the pipeline's defaults. UMT5 comes to the device only when a prompt is
        not cached or the negative prompt is not yet encoded (with the cache off it is there already)."""
        from framer_ds.tasks.video_lora.wan.clip_sampler import WanClipSampler, WanSampling

        sampling = WanSampling.for_base(self.base_path())
        self.frozen.on_device(self.accelerator, text=False)

        def with_text():
            self.frozen.on_device(self.accelerator, text=True)
            return self.frozen

        def negative() -> torch.Tensor:
            if self._negative is None:
                from framer_ds.tasks.video_lora.wan.clip_sampler import encode_prompt

                prompt = sampling.defaults.negative_prompt
                self._negative = encode_prompt(with_text(), prompt, MAX_SEQUENCE_LENGTH).cpu()
            return self._negative.to(self.accelerator.device)

        return WanClipSampler(
            model, self.frozen, sampling, self.prompts, negative, MAX_SEQUENCE_LENGTH, with_text
        )

    # --- `framer-ds smoke` ---------------------------------------------------------------------------

    def smoke_bases(self) -> list[tuple[str, Any, Callable[[Path, Path], Path], str]]:
        from framer_ds.tasks.video_lora.wan.smoke_base import create_smoke_wan

        path = self.config.model.base.source.path
        return [] if path is None else [("model.base.source.path", path, create_smoke_wan, "Wan")]

    def smoke_export_format(self) -> str:
        """ComfyUI's Wan keys."""
        return "comfyui"

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The VAE in float32, CLIP and UMT5 in the compute dtype (`FrozenWanEncoders.on_device`)."""
        return [torch.float32] + [compute] * (len(helpers) - 1) if helpers else []

    def decode_transient(self, vae: torch.nn.Module, chunk: int) -> None:
        """One latent frame at full size through `wan/sampling.decode_latents`. Wan's VAE decodes a clip
        one latent frame per decoder call (a causal cache carries the rest), so a call's activations are
        one latent frame's; the planner's tracker refuses a module called again within one probe, so the
        later calls (4 pixel frames each, the first gives 1) and the growing output are not measured:
        a lower bound of the decode's peak."""
        from framer_ds.tasks.video_lora.wan.sampling import decode_latents

        data, spatial = self.config.data, vae.config.scale_factor_spatial
        shape = (1, vae.config.z_dim, 1, data.height // spatial, data.width // spatial)
        decode_latents(vae, torch.zeros(shape, device=next(vae.parameters()).device))

    def cache_description(self, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
        """The source clips, the encoders' files, the prompts each clip is encoded with, the mode. Not a
        two-expert base's expert or boundary: the cached tensors (latents, condition, prompt states) do
        not depend on them (the noise level is drawn at training time), so the high- and low-noise runs
        of one dataset share one cache and the second run encodes nothing."""
        records = getattr(dataset, "records", [])
        return {
            **cache_basics(self.config, dataset, split, copies, dtype),
            "base": "wan",
            "encoders": files_fingerprint(self.base_path(), ENCODER_FOLDERS),
            "prompts": sorted((r.video_id, self.prompts.get(r.video_id)) for r in records),
            "max_sequence_length": MAX_SEQUENCE_LENGTH,
            **({"expand_timesteps": True} if self.expand_timesteps else {}),  # its condition differs
            "data": self.config.data.model_dump(mode="json", exclude={"cache", "val_fraction", "source"}),
        }

    def example_batch(self, config: Any, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """From the VAE's, transformer's, image and text encoders' config.json (no weights); no image
        states for a base without an image encoder (its cache holds none)."""
        vae, transformer = self._folder_config("vae"), self._folder_config(self.transformer_subfolder())
        text = self._folder_config("text_encoder")
        data, k, scale = config.data, micro_batch_size, vae["scale_factor_spatial"]
        latent_frames = (data.num_frames - 1) // self.temporal_factor() + 1
        latent = (latent_frames, data.height // scale, data.width // scale)
        condition = (transformer["in_channels"] - vae["z_dim"], *latent)  # mask + given frames' latents
        if self.expand_timesteps:  # TI2V: the first frame's latents
            condition = (vae["z_dim"], 1, *latent[1:])
        batch = {
            "target": torch.zeros(k, vae["z_dim"], *latent),
            "condition": torch.zeros(k, *condition),
            "prompt_emb": torch.zeros(k, MAX_SEQUENCE_LENGTH, text["d_model"]),
        }
        if self.frozen.with_image_encoder:
            image = self._folder_config("image_encoder")
            tokens = (image["image_size"] // image["patch_size"]) ** 2 + 1
            frames = 2 if self.interpolation else 1
            batch["image_emb"] = torch.zeros(k, frames, tokens, image["hidden_size"])
        return batch
