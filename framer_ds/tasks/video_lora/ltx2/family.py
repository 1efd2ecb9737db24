"""The LTX-2 family: Lightricks' LTX-2 image-to-video (first frame) and keyframe interpolation (first +
last frame) under rectified flow, through diffusers' own classes (`LTX2VideoTransformer3DModel`,
`AutoencoderKLLTX2Video`, Gemma 3 + `LTX2TextConnectors`; sampling is `LTX2ImageToVideoPipeline` /
`LTX2ConditionPipeline` themselves, ltx2/sampling.py).

Video only: the LoRA sits on the video branch (ltx2/lora.py), the audio branch is frozen and fed noise
at sigma 1 while training (ltx2/objective.py says why); the audio VAE and vocoder are loaded only by the
pipelines that sample. What it encodes (ltx2/conditioning.py) is what the pipelines feed the
transformer; the cache holds the target latents, the keyframe latents and the connectors' prompt states,
so with a complete cache neither the VAE nor Gemma is ever loaded to train.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.ltx2 import conditioning as ltx
from framer_ds.tasks.video_lora.ltx2 import frame_rate as rate
from framer_ds.tasks.video_lora.ltx2 import objective as fm
from framer_ds.tasks.video_lora.ltx2.encoders import FrozenLtx2Encoders, Ltx2EncodedClip
from framer_ds.tasks.video_lora.ltx2.export import Ltx2Exports
from framer_ds.tasks.video_lora.ltx2.options import FRAME_RATE, IMAGE_CRF, MAX_SEQUENCE_LENGTH
from framer_ds.tasks.video_lora.ltx2.preflight import frame_count_problem, ltx2_problems
from framer_ds.tasks.video_lora.shared.cache_key import cache_basics, files_fingerprint
from framer_ds.tasks.video_lora.shared.captions import CaptionedClips
from framer_ds.tasks.video_lora.shared.protocol import VideoBaseFamily, per_clip_noise

ENCODER_FOLDERS = ("vae", "text_encoder", "tokenizer", "connectors")


class Ltx2Family(CaptionedClips, Ltx2Exports, VideoBaseFamily):
    """LTX-2 bases (`model.base.name: ltx2`): LoRA on the video branch of the transformer, the rest frozen."""

    frozen_helper_names = "video VAE + Gemma 3 text encoder + text connectors"

    def __init__(self, config: Any):
        super().__init__(config)
        self._frozen = FrozenLtx2Encoders(self.base_path())
        self.rates: set[float] = set()  # every rate a clip can train at, from `note_records`

    @property
    def frozen(self) -> FrozenLtx2Encoders:
        return self._frozen

    def base_path(self) -> Path:
        source = self.config.model.base.source
        return default_cache_dir() / source.builtin if source.builtin else Path(source.path)

    def folder_config(self, sub: str, name: str = "config.json") -> dict[str, Any]:
        return json.loads((self.base_path() / sub / name).read_text())

    def prepare(self) -> None:
        if self.config.model.base.source.builtin is not None:
            from framer_ds.tasks.video_lora.ltx2.tiny import create_tiny_ltx2

            create_tiny_ltx2(self.base_path())

    def check(self, data_root: Path) -> list[ConfigProblem]:
        frames = self.frame_count_problem(self.config.data.num_frames)
        return ltx2_problems(self.config, self.base_path(), data_root, self.size_multiple(), frames)

    def note_records(self, records: list[Any]) -> None:
        super().note_records(records)
        self.rates |= rate.possible_rates(records, self.config.data)

    @property
    def per_clip_calls(self) -> bool:
        """Whether the clips of a micro-batch can differ in rate, so each is its own transformer call (the
        audio length is one per call: ltx2/frame_rate.py)."""
        return self.config.model.fps is None and len(self.rates) > 1

    # --- LTX-2's size and frame-count rules ------------------------------------------------------------

    def _compression(self) -> tuple[int, int]:
        """(spatial, temporal) of the folder's VAE; LTX-2's (32, 8) before a builtin base is built."""
        try:
            return ltx.compression(self.folder_config("vae"))
        except (OSError, ValueError, KeyError):
            return 32, 8

    def size_multiple(self) -> int:
        """The VAE's spatial compression times the transformer's patch (32 x 1 on LTX-2)."""
        try:
            patch = int(self.folder_config("transformer")["patch_size"])
        except (OSError, ValueError, KeyError):
            patch = 1
        return self._compression()[0] * patch

    def temporal_factor(self) -> int:
        """Pixel frames per latent frame after the first (8 on LTX-2)."""
        return self._compression()[1]

    def min_frames(self) -> int:
        return 1 + self.temporal_factor()

    def frame_count_problem(self, num_frames: int) -> str | None:
        """LTX-2's VAE encodes the first frame alone, then `temporal_factor` frames per latent frame."""
        return frame_count_problem(num_frames, self.temporal_factor())

    def frame_grid(self) -> tuple[int, int]:
        """Auto buckets' lengths are the VAE's: 1 + k * temporal_factor (9, 17, 25, ... on LTX-2)."""
        return 1, self.temporal_factor()

    # --- models --------------------------------------------------------------------------------------

    def build_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        """The transformer, frozen, with a peft LoRA on the video branch (`ltx2/lora.py`)."""
        from diffusers import LTX2VideoTransformer3DModel
        from peft import LoraConfig, get_peft_model

        from framer_ds.tasks.video_lora.ltx2.lora import lora_targets

        transformer = load_pretrained(LTX2VideoTransformer3DModel, self.base_path(), subfolder="transformer")
        transformer.requires_grad_(False)
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        lora = self.config.model.lora
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora_targets(lora),
            init_lora_weights=lora.peft_init(),
        )
        return get_peft_model(transformer, config)

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        return ["LTX2VideoTransformerBlock"]

    # --- objective -----------------------------------------------------------------------------------

    @property
    def interpolation(self) -> bool:
        return self.config.model.base.mode == "interpolation"

    def encode(self, batch, eval_generator: list[torch.Generator] | None = None) -> Ltx2EncodedClip:
        """Read back from the cache, or encoded now as the pipelines encode (deterministic)."""
        if "target" in batch:
            return Ltx2EncodedClip.from_cached_batch(batch)
        frozen, pixels = self.frozen, batch["pixel_values"]  # [B, T, 3, H, W] in [-1, 1]
        prompts = [self.prompts[video_id] for video_id in batch["video_id"]]
        video, audio, mask = ltx.encode_prompts(
            frozen.text_encoder, frozen.tokenizer, frozen.connectors, prompts, MAX_SEQUENCE_LENGTH
        )
        last = ltx.encode_keyframes(frozen.vae, pixels[:, -1], IMAGE_CRF) if self.interpolation else None
        return Ltx2EncodedClip(
            target=ltx.encode_video_latents(frozen.vae, pixels.transpose(1, 2)),
            first=ltx.encode_keyframes(frozen.vae, pixels[:, 0], IMAGE_CRF),
            video_prompt=video,
            audio_prompt=audio,
            prompt_mask=mask,
            fps=batch["fps"],
            last=last,
        )

    def clip_rates(self, encoded: Ltx2EncodedClip) -> list[float]:
        """The frame rate each clip of `encoded` trains at (`model.fps`, else its own: ltx2/frame_rate.py)."""
        return rate.clip_rates(encoded.fps, self.config.model.fps)

    def _tokens(self, encoded: Ltx2EncodedClip) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(x0 tokens [B, S, C], conditioning mask [B, S], keyframe coords or None): latent frame 0
        replaced by the first frame's own latents, the last frame's appended (interpolation) at its
        clip's frame rate."""
        target = encoded.target.float()
        x0 = torch.cat([encoded.first.float().to(target), target[:, :, 1:]], dim=2)
        mask = torch.zeros_like(x0[:, :1])
        mask[:, :, 0] = 1
        tokens, token_mask = ltx.pack(x0), ltx.pack(mask)[..., 0]
        if encoded.last is None:
            return tokens, token_mask, None
        last = ltx.pack(encoded.last.float().to(target))
        tokens = torch.cat([tokens, last], dim=1)
        token_mask = torch.cat([token_mask, torch.ones_like(last[..., 0])], dim=1)
        frames, height, width = target.shape[2:]
        coords = rate.keyframe_coords(
            self.folder_config("vae"), frames - 1, (height, width), self.clip_rates(encoded), x0.device
        )
        return tokens, token_mask, coords

    def velocity(
        self, model, noisy: torch.Tensor, token_sigma: torch.Tensor, sigmas: torch.Tensor, encoded, coords
    ):
        """The transformer's video velocity, called as the pipelines call it at each clip's frame rate:
        the video (and keyframe) positions per clip; one call per clip where the run's clips can differ
        in rate, so each has its audio length (ltx2/frame_rate.py)."""
        from framer_ds.tasks.video_lora.ltx2.lora import unwrapped

        rates, latent_shape = self.clip_rates(encoded), tuple(encoded.target.shape[2:])
        video_coords = rate.video_coords(unwrapped(model).rope, rates, latent_shape, noisy.device)
        if coords is not None:
            video_coords = torch.cat([video_coords, coords.to(video_coords)], dim=2)
        num_frames = (latent_shape[0] - 1) * self.temporal_factor() + 1
        audio_config = self.folder_config("audio_vae")
        lengths = [rate.audio_latent_frames(audio_config, num_frames, r) for r in rates]
        inputs = (noisy, token_sigma, sigmas, encoded.video_prompt, encoded.audio_prompt, encoded.prompt_mask)
        groups = rate.call_groups(lengths, self.per_clip_calls)
        if len(groups) == 1:  # one call for the micro-batch, as the pipelines make it
            return self._transformer_call(model, latent_shape, groups[0][0], *inputs, video_coords)
        parts, order = [], []
        for audio_frames, clips in groups:
            picked = [t[torch.tensor(clips, device=t.device)] for t in (*inputs, video_coords)]
            parts.append(self._transformer_call(model, latent_shape, audio_frames, *picked))
            order += clips
        return torch.cat(parts)[torch.tensor(order, device=noisy.device).argsort()]

    def _transformer_call(
        self, model, latent_shape, audio_frames: int, noisy, token_sigma, sigmas, video, audio, mask, coords
    ) -> torch.Tensor:
        """One call of the transformer on clips of one audio length: the frozen audio branch gets a fixed
        draw of noise at sigma 1 (not learnt: ltx2/objective.py). No `fps`: the transformer reads it only
        to build the video coordinates, which are given (each clip's own)."""
        from framer_ds.tasks.video_lora.ltx2.lora import unwrapped

        dtype = next(model.parameters()).dtype
        batch, (frames, height, width) = noisy.shape[0], latent_shape
        channels = unwrapped(model).config.audio_in_channels
        generator = torch.Generator(device="cpu").manual_seed(0)  # fixed: the audio is not learnt
        audio_noise = torch.randn(batch, audio_frames, channels, generator=generator).to(noisy.device, dtype)
        full = torch.full((batch,), float(fm.NUM_TRAIN_TIMESTEPS), device=noisy.device)
        return model(
            hidden_states=noisy.to(dtype),
            audio_hidden_states=audio_noise,
            encoder_hidden_states=video.to(dtype),
            audio_encoder_hidden_states=audio.to(dtype),
            timestep=token_sigma * fm.NUM_TRAIN_TIMESTEPS,
            audio_timestep=full,
            sigma=sigmas * fm.NUM_TRAIN_TIMESTEPS,
            audio_sigma=full,
            encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=frames,
            height=height,
            width=width,
            audio_num_frames=audio_frames,
            video_coords=coords,
            use_cross_timestep=True,
            return_dict=False,
        )[0]

    def _losses_at(self, model, encoded, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
        x0, mask, coords = self._tokens(encoded)
        noisy, token_sigma = fm.noisy_tokens(x0, noise, sigmas, mask)
        prediction = self.velocity(model, noisy, token_sigma, sigmas, encoded, coords)
        return fm.masked_flow_loss(prediction, x0, noise, mask)

    def _scheduler_config(self) -> dict[str, Any]:
        return self.folder_config("scheduler", "scheduler_config.json")

    def training_loss(self, model, batch) -> torch.Tensor:
        encoded = self.encode(batch)
        x0, _, _ = self._tokens(encoded)
        u = torch.rand(x0.shape[0]).clamp(1e-3, 1 - 1e-3)
        sigmas = fm.shifted_sigmas(self._scheduler_config(), x0.shape[1], u).to(x0.device)
        return self._losses_at(model, encoded, torch.randn_like(x0), sigmas).mean()

    def eval_losses(self, model, batch, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        """Per-clip losses at fixed sigmas (the shifted quantiles (i + 0.5) / n), each clip's noise from
        its own generator."""
        encoded = self.encode(batch, generators)
        x0, _, _ = self._tokens(encoded)
        noise = per_clip_noise(x0, generators)
        n = self.config.model.base.eval_sigmas
        u = torch.tensor([(i + 0.5) / n for i in range(n)])
        values: dict[str, torch.Tensor] = {}
        for sigma in fm.shifted_sigmas(self._scheduler_config(), x0.shape[1], u).tolist():
            sigmas = torch.full((x0.shape[0],), sigma, device=x0.device)
            values[f"loss_sigma_{sigma:.3g}"] = self._losses_at(model, encoded, noise, sigmas)
        values["loss"] = torch.stack(list(values.values())).mean(dim=0)
        return values

    # --- sampling the model being trained -------------------------------------------------------------

    def training_sampler(self, model: torch.nn.Module):
        """`Ltx2ClipSampler` (ltx2/sampling.py): diffusers' pipeline of the base folder around the model
        being trained (loads its own VAE, Gemma, audio VAE and vocoder; released with the round)."""
        from framer_ds.tasks.video_lora.ltx2.sampling import Ltx2ClipSampler

        return Ltx2ClipSampler(model, self, self.accelerator.device)

    # --- `framer-ds smoke` ---------------------------------------------------------------------------

    def smoke_bases(self) -> list[tuple[str, Any, Callable[[Path, Path], Path], str]]:
        from framer_ds.tasks.video_lora.ltx2.smoke_base import create_smoke_ltx2

        path = self.config.model.base.source.path
        return [] if path is None else [("model.base.source.path", path, create_smoke_ltx2, "LTX-2")]

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The VAE in float32, Gemma and the connectors in the compute dtype."""
        return [torch.float32] + [compute] * (len(helpers) - 1) if helpers else []

    def decode_transient(self, vae: torch.nn.Module, chunk: int) -> None:
        """One latent frame at full size through the VAE's decoder (a lower bound of a round's decode)."""
        data, spatial = self.config.data, self._compression()[0]
        shape = (1, vae.config.latent_channels, 1, data.height // spatial, data.width // spatial)
        vae.decode(torch.zeros(shape, device=next(vae.parameters()).device))

    def cache_description(self, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
        """The source clips, the encoders' files, the prompts, the mode, the CRF of the keyframes and what
        an entry holds (an entry without the clip's fps, written before it was stored, is not read)."""
        records = getattr(dataset, "records", [])
        return {
            **cache_basics(self.config, dataset, split, copies, dtype),
            "base": "ltx2",
            "mode": self.config.model.base.mode,
            "encoders": files_fingerprint(self.base_path(), ENCODER_FOLDERS),
            "prompts": sorted((r.video_id, self.prompts.get(r.video_id)) for r in records),
            "max_sequence_length": MAX_SEQUENCE_LENGTH,
            "image_crf": IMAGE_CRF,
            "entry": [field.name for field in fields(Ltx2EncodedClip)],
            "data": self.config.data.model_dump(mode="json", exclude={"cache", "val_fraction", "source"}),
        }

    def example_batch(self, config: Any, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """From the VAE's, transformer's and connectors' config.json (no weights)."""
        vae, transformer = self.folder_config("vae"), self.folder_config("transformer")
        data, k = config.data, micro_batch_size
        spatial, temporal = ltx.compression(vae)
        latent = ((data.num_frames - 1) // temporal + 1, data.height // spatial, data.width // spatial)
        channels, one = vae["latent_channels"], (1, latent[1], latent[2])
        batch = {
            "target": torch.zeros(k, channels, *latent),
            "first": torch.zeros(k, channels, *one),
            "video_prompt": torch.zeros(k, MAX_SEQUENCE_LENGTH, transformer["caption_channels"]),
            "audio_prompt": torch.zeros(k, MAX_SEQUENCE_LENGTH, transformer["caption_channels"]),
            "prompt_mask": torch.ones(k, MAX_SEQUENCE_LENGTH),
            "fps": torch.full((k,), float(config.model.fps or FRAME_RATE)),
        }
        if self.interpolation:
            batch["last"] = torch.zeros(k, channels, *one)
        return batch
