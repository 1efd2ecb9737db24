"""LTX-2's rectified-flow objective on the transformer's tokens, with diffusers' own conventions.

Noise levels: u ~ U(0, 1) shifted by the folder's scheduler exactly as sampling shifts its sigmas
(`FlowMatchEulerDiscreteScheduler.time_shift`'s functions at mu = `calculate_shift(video tokens, ...)`
from the scheduler config: LTX-2's resolution-dependent shift), so training spends its steps where the sampler
does. A token of a given frame (mask 1: the first latent frame, the last keyframe) stays clean and is
told so by its own timestep 0 (`timestep * (1 - conditioning_mask)`, as the pipelines), and carries no
loss; the others are x_t = (1 - sigma) x0 + sigma noise with target velocity noise - x0 (the pipelines'
`convert_velocity_to_x0` is x_t - sigma * v).

Audio (video-only training): the audio branch is frozen and sees pure noise at sigma 1 (audio timestep
1000), the state the pipelines start their audio from; its prediction is not trained.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

NUM_TRAIN_TIMESTEPS = 1000


def shift_mu(scheduler_config: dict[str, Any], video_tokens: int) -> float:
    """The pipelines' mu for a sequence of `video_tokens` (their `calculate_shift` with the config's values
    and the pipelines' fallbacks)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_image2video import calculate_shift

    get = scheduler_config.get
    return calculate_shift(
        video_tokens,
        get("base_image_seq_len", 1024),
        get("max_image_seq_len", 4096),
        get("base_shift", 0.95),
        get("max_shift", 2.05),
    )


def shifted_sigmas(scheduler_config: dict[str, Any], video_tokens: int, u: Tensor) -> Tensor:
    """u in (0, 1) -> the sigmas the scheduler's shift makes of them at this sequence length (no shift
    when the config does not use dynamic shifting: its static `shift` instead)."""
    from diffusers import FlowMatchEulerDiscreteScheduler as Scheduler

    if scheduler_config.get("use_dynamic_shifting"):
        mu = shift_mu(scheduler_config, video_tokens)
        # the scheduler's own shift functions (they read nothing of the instance; building one would
        # make tensors, which `framer-ds plan`'s fake-tensor probe cannot)
        if scheduler_config.get("time_shift_type", "exponential") == "linear":
            return Scheduler._time_shift_linear(None, mu, 1.0, u)
        return Scheduler._time_shift_exponential(None, mu, 1.0, u)
    shift = float(scheduler_config.get("shift", 1.0))
    return shift * u / (1 + (shift - 1) * u)


def noisy_tokens(x0: Tensor, noise: Tensor, sigmas: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(x_t, per-token sigma [B, S]): given tokens (mask 1) clean, the rest at their clip's sigma."""
    token_sigma = sigmas[:, None] * (1 - mask)
    return (1 - token_sigma[..., None]) * x0 + token_sigma[..., None] * noise, token_sigma


def masked_flow_loss(prediction: Tensor, x0: Tensor, noise: Tensor, mask: Tensor) -> Tensor:
    """Per-clip mean squared velocity error [B] over the tokens to generate (mask 0)."""
    error = (prediction.float() - (noise - x0)).pow(2).mean(dim=-1)
    weights = 1 - mask
    return (error * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1)
