"""What a video_lora run's evaluation phase puts on the device beyond the training step (a `framer-ds
plan` input, through the planning hooks of tasks/planning.py: `eval_only_helpers`, `helper_dtypes`
and `eval_transient`).

Why it matters: with the latent cache on, the VAE and the image encoder leave the device once the cache
is filled, and come back for every validation-sample round and every interp_eval. There the denoiser
runs a guided batch (conditional + unconditional) without gradients, and the VAE decodes
`decode_chunk_size` frames at full resolution, beside the weights and optimizer states that stay
resident. With gradient checkpointing (small training activations) that phase can be the run's peak:
an out-of-memory at the first sample round, hours into the job, that a plan of the training step alone
would not foresee.
"""

from __future__ import annotations

from typing import Any

import torch


def samples_during_training(config: Any) -> bool:
    """Validation samples or interpolation metrics: the evaluations that decode videos."""
    return bool(config.model.samples.every) or config.model.interp_eval.enabled


def decode_chunk(config: Any) -> int:
    """The most frames one VAE decode call takes in any of those evaluations."""
    model, chunks = config.model, []
    if model.samples.every:
        chunks.append(model.samples.decode_chunk_size)
    if model.interp_eval.enabled:
        chunks.append(model.interp_eval.decode_chunk_size)
    return min(max(chunks, default=1), config.data.num_frames)


class VideoEvalMemory:
    """The evaluation-phase hooks of `VideoLoraTask` (mixed in: they need its config, frozen encoders and
    training loss)."""

    def eval_only_helpers(self) -> list[torch.nn.Module]:
        """The VAE and image encoder when the latent cache keeps them off the device in training and
        sampling brings them back; without the cache they are `frozen_helpers` already."""
        if self.config.data.cache.enabled and samples_during_training(self.config):
            return list(self.frozen.load())
        return []

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The dtypes the base family's `frozen.on_device` puts its helpers in (a VAE in float32)."""
        return self.family.helper_dtypes(helpers, compute)

    def eval_transient(self, model: torch.nn.Module, helpers: list[torch.nn.Module], batch: dict) -> None:
        """The denoiser on a guided batch (`batch` holds 2 clips: the conditional and unconditional
        halves of one sample) and the VAE decoding as the base family's sampler decodes."""
        if not samples_during_training(self.config) or not helpers:
            return
        with torch.no_grad():
            self.training_loss(model, batch)
            self.family.decode_transient(helpers[0], decode_chunk(self.config))
