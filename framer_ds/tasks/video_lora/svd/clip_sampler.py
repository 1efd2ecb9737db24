"""The SVD family's sampler of the model being trained: SVD's (and Framer's) Euler sampling
(`diffusion/sampling.sample_video`) with the run's frozen VAE and CLIP image encoder, for validation
samples and interp_eval.

Why apart from svd.py: svd.py is the objective and the model; this is the inference loop's inputs
(the base's scheduler, fps and motion-bucket conditioning, a family's own conditioning such as Framer's
ControlNet on a clip's heatmaps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framer_ds.tasks.video_lora.shared.protocol import ClipToSample, FamilySampler

if TYPE_CHECKING:  # diffusers loads when sampling starts
    from framer_ds.tasks.video_lora.svd.sampling import SamplerParts


class SvdClipSampler(FamilySampler):
    """`sample_video` on `parts` (the model being trained + the frozen VAE, encoder, scheduler);
    `conditioning`: None (SVD's own), or what gives a clip's `SamplingConditioning` by its heatmaps
    (`.sampling(controlnet_cond)`: a Framer family, its ControlNet on each clip's own heatmaps);
    `motion_bucket`: the run's fixed bucket, for clips without one of their own."""

    def __init__(self, parts: SamplerParts, tile_size: int | None, conditioning: Any, motion_bucket: int):
        self.parts, self.tile_size, self.conditioning = parts, tile_size, conditioning
        self.motion_bucket = motion_bucket

    def _bucket(self, clip: ClipToSample) -> int:
        return clip.motion_bucket if clip.motion_bucket is not None else self.motion_bucket

    def sample(
        self,
        clip: ClipToSample,
        settings: Any,
        generator: torch.Generator,
        on_step: Callable[[], Any] | None = None,
    ) -> torch.Tensor:
        from framer_ds.tasks.video_lora.svd import sampling

        source = self.conditioning
        conditioning = source.sampling(clip.controlnet_cond) if source is not None else None
        return sampling.sample_video(
            self.parts,
            clip.first,
            clip.last,
            clip.num_frames,
            clip.fps,
            self._bucket(clip),
            generator=generator,
            **settings.sampling_kwargs(),
            tile_size=self.tile_size,
            conditioning=conditioning,
            on_step=on_step,
        )

    def steps(self, settings: Any) -> int:
        return settings.num_inference_steps

    def embed(self, frames: torch.Tensor) -> torch.Tensor:
        """SVD's CLIP image embeddings (the projection), as the conditioning uses them."""
        from framer_ds.tasks.video_lora.svd.conditioning import clip_image_embeddings

        return clip_image_embeddings(self.parts.image_encoder, frames).flatten(1)

    def record(self, clip: ClipToSample, settings: Any) -> dict[str, Any]:
        """A clip of a from_data run moves at its own bucket (the clip's motion score, the measure that
        the sampler's `--motion-bucket auto` applies to the given frames), others at the configured one."""
        own = clip.motion_bucket is not None
        return {
            "fps": clip.fps,
            "motion_bucket": self._bucket(clip),
            "motion_bucket_source": "the clip's motion score (from_data)" if own else "model.motion_bucket",
            **settings.sampling_kwargs(),
        }
