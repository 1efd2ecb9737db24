"""The Wan family's sampling: one clip from its first (and last) frame through `wan/sampling.sample_video`
with the base folder's own scheduler and `WanImageToVideoPipeline`'s defaults (guidance, shift, negative
prompt), shared by `framer-ds sample` (an export, wan/export.py) and the samples and interp_eval of a
run (the model being trained, `WanClipSampler`), so both give the same frames for the same adapter, seed
and inputs.

Prompts: a clip's prompt (the fixed one or its caption) is encoded by UMT5 alone, as the latent cache
encodes it, so a cached clip's stored prompt states are exactly what sampling would compute, and a run
with the cache takes them from there. The negative prompt ("") is encoded once per run and kept; under
the cache that is the only time sampling loads UMT5 (then released with the other encoders).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.shared.protocol import ClipToSample, FamilySampler
from framer_ds.tasks.video_lora.wan import conditioning as wan
from framer_ds.tasks.video_lora.wan.sampling import WanSamplingDefaults, sample_video


@dataclass
class WanSampling:
    """What sampling a base folder takes from it: the pipeline's defaults and its own scheduler."""

    defaults: WanSamplingDefaults
    scheduler: Any  # `load_base_scheduler(folder)`: UniPC on the hub folders
    scheduler_config: dict[str, Any]

    @classmethod
    def for_base(cls, base: Any) -> WanSampling:
        from framer_ds.tasks.video_lora.wan.sampling import (
            load_base_scheduler,
            pipeline_defaults,
            read_scheduler_config,
        )

        return cls(pipeline_defaults(base), load_base_scheduler(base), read_scheduler_config(base))


def encode_prompt(encoders: Any, prompt: str, max_sequence_length: int) -> Tensor:
    """[1, L, D] UMT5 states of one prompt, encoded alone (as a cache entry's and the pipeline's)."""
    return wan.encode_prompts(encoders.text_encoder, encoders.tokenizer, [prompt], max_sequence_length)


@torch.no_grad()
def sample_clip(
    transformer: torch.nn.Module,
    encoders: Any,
    sampling: WanSampling,
    texts: tuple[Tensor, Tensor | None],
    frames: tuple[Tensor, Tensor | None],
    num_frames: int,
    steps: int,
    guidance: float,
    generator: torch.Generator,
    on_step: Callable[[], Any] | None = None,
    transformer_2: torch.nn.Module | None = None,
    boundary_ratio: float | None = None,
    guidance_scale_2: float | None = None,
) -> Tensor:
    """Frames [1, F, 3, H, W] in [0, 1]: `texts` (prompt, negative) states [1, L, D] (the negative is
    needed when guidance > 1), `frames` (first, last) [1, 3, H, W] in [-1, 1] (last None: I2V).
    `encoders`: a `FrozenWanEncoders` (no CLIP states on a base without an image encoder). Wan 2.2:
    `transformer_2` (the low-noise expert) below `boundary_ratio`, at `guidance_scale_2`; TI2V-5B
    (`expand_timesteps`): conditioned on the first frame's latents (wan/ti2v.py)."""
    first, last = frames
    latent_frames = condition = None
    if sampling.defaults.expand_timesteps:
        from framer_ds.tasks.video_lora.wan import ti2v

        condition = ti2v.first_frame_latents(encoders.vae, first)
        latent_frames = ti2v.latent_frames(num_frames, encoders.vae.config.scale_factor_temporal)
    return sample_video(
        transformer,
        encoders.vae,
        sampling.scheduler_config,
        texts[0],
        texts[1],
        encoders.encode_images(first, last),
        wan.condition_latents(encoders.vae, first, last, num_frames) if condition is None else condition,
        steps,
        guidance,
        generator,
        sampling.defaults.shift,
        transformer_2=transformer_2,
        boundary_ratio=boundary_ratio,
        guidance_scale_2=guidance_scale_2,
        scheduler=sampling.scheduler,
        on_step=on_step,
        num_latent_frames=latent_frames,
    )


class WanClipSampler(FamilySampler):
    """The model being trained (the prepared model) with the run's frozen encoders, at the pipeline's
    defaults. `prompts`: video_id -> prompt; `negative`: gives the negative prompt's states (encoded
    once per run by the family); `text_encoder`: gives the encoders with UMT5 loaded."""

    def __init__(
        self,
        model: torch.nn.Module,
        encoders: Any,
        sampling: WanSampling,
        prompts: dict[str, str],
        negative: Callable[[], Tensor],
        max_sequence_length: int,
        text_encoder: Callable[[], Any],
    ):
        self.model, self.encoders, self.sampling = model, encoders, sampling
        self.prompts, self.negative = prompts, negative
        self.max_sequence_length, self.text_encoder = max_sequence_length, text_encoder

    def _prompt_states(self, clip: ClipToSample) -> Tensor:
        """The clip's cached states, else UMT5 on its prompt (loaded now if the cache kept it away)."""
        if clip.prompt_emb is not None:
            return clip.prompt_emb[None]
        return encode_prompt(self.text_encoder(), self.prompts[clip.video_id], self.max_sequence_length)

    def sample(
        self,
        clip: ClipToSample,
        settings: Any,
        generator: torch.Generator,
        on_step: Callable[[], Any] | None = None,
    ) -> Tensor:
        defaults = self.sampling.defaults
        negative = self.negative() if defaults.guidance_scale > 1 else None
        frames = (clip.first[None], clip.last[None] if clip.last is not None else None)
        video = sample_clip(
            self.model,
            self.encoders,
            self.sampling,
            (self._prompt_states(clip), negative),
            frames,
            clip.num_frames,
            settings.num_inference_steps,
            defaults.guidance_scale,
            generator,
            on_step,
        )
        return video[0] * 2 - 1

    def steps(self, settings: Any) -> int:
        return settings.num_inference_steps

    @torch.no_grad()
    def embed(self, frames: Tensor) -> Tensor:
        """The CLIP image encoder's pooled output of each frame (the run's own CLIP, preprocessed as
        the conditioning preprocesses a frame)."""
        encoder = self.encoders.image_encoder
        images = wan.to_uint8_images(frames)
        inputs = self.encoders.image_processor(images=images, return_tensors="pt")
        inputs = inputs.to(next(encoder.parameters()).device)
        return encoder(**inputs).pooler_output.float()

    def record(self, clip: ClipToSample, settings: Any) -> dict[str, Any]:
        defaults = self.sampling.defaults
        return {
            "prompt": self.prompts.get(clip.video_id),
            "prompt_states": "the latent cache" if clip.prompt_emb is not None else "UMT5",
            "negative_prompt": defaults.negative_prompt,
            "guidance_scale": defaults.guidance_scale,
            "shift": defaults.shift,
            "scheduler": defaults.scheduler_class,
            "num_inference_steps": settings.num_inference_steps,
        }
