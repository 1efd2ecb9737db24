"""Rectified-flow (flow-matching) objective and Euler sampler, in diffusers' conventions.

Wan (and every flow-matching DiT diffusers ships) is trained and sampled on a straight path between data
and noise: sigma in [0, 1], x_t = (1 - sigma) * x0 + sigma * noise, and the network predicts the velocity
noise - x0. The schedule ("shift") bends how sigmas are spread: shift * s / (1 + (shift - 1) * s) moves
them towards the noisy end, which is what large video latents need (Wan: 3.0 at 480p, 5.0 at 720p).

Everything here follows diffusers' `FlowMatchEulerDiscreteScheduler` (0.42.1) and finetrainers'
training loop (`finetrainers/utils/diffusion.py`, `functional/diffusion.py`): training sigmas are picked
from the scheduler's own 1000-entry shifted table (so training and sampling agree on every value), the
transformer's timestep is sigma * num_train_timesteps, and the sampler's schedule is diffusers'
`set_timesteps` (which shifts a linspace between the already-shifted end points: diffusers' quirk, kept
so a LoRA trained here samples exactly as the diffusers pipeline does). The tests check each piece
against diffusers' own scheduler and training utilities.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

import numpy as np
import torch

TimestepSampling = Literal["uniform", "logit_normal"]
LossWeighting = Literal["none", "sigma_sqrt", "cosmap"]

NUM_TRAIN_TIMESTEPS = 1000
# Wan 2.1's sampling shift (diffusers' Wan pipelines: "5.0 for 720P, 3.0 for 480P").
WAN_SHIFT_480P = 3.0
WAN_SHIFT_720P = 5.0


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """Wan/SD3's static shift: shift * s / (1 + (shift - 1) * s); 1.0 leaves sigmas unchanged."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def training_sigma_table(shift: float, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """The scheduler's training sigmas (`FlowMatchEulerDiscreteScheduler(shift=shift).sigmas`), from
    sigma 1 (pure noise) down to shift(1 / N), float32."""
    steps = torch.linspace(num_train_timesteps, 1, num_train_timesteps, dtype=torch.float32)
    return shift_sigmas(steps / num_train_timesteps, shift)


def expert_index_range(
    shift: float, boundary_ratio: float, expert: str, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> tuple[int, int]:
    """[lo, hi) of the training table's indices one Wan 2.2 expert sees: 'high_noise' the entries whose
    timestep (sigma * N, as the transformer is fed) is >= boundary_ratio * N, the pipeline's switch
    `t >= boundary_timestep`; 'low_noise' the rest. The table descends, so each range is contiguous.

    In numpy float32, the same correctly rounded operations as `training_sigma_table` (and diffusers'
    scheduler), so the split is bit-for-bit theirs: a torch table would be a fake tensor under
    `framer-ds plan`, whose count is data-dependent there."""
    n = num_train_timesteps
    sigmas = np.linspace(n, 1, n, dtype=np.float32) / np.float32(n)
    table = np.float32(shift) * sigmas / (np.float32(1) + np.float32(shift - 1) * sigmas)
    split = int((table * np.float32(n) >= boundary_ratio * n).sum())
    lo, hi = (0, split) if expert == "high_noise" else (split, num_train_timesteps)
    if hi <= lo:
        raise ValueError(f"the {expert} expert's range is empty at boundary_ratio {boundary_ratio}")
    return lo, hi


def _unit_draws_in(
    lo: float,
    hi: float,
    batch_size: int,
    sampling: TimestepSampling,
    mean: float,
    std: float,
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """u in [lo, hi) distributed as the full-range draw conditioned on landing there (rejection sampling
    without the loop, by the inverse CDF): uniform stays uniform, logit-normal keeps its bell's shape
    (musubi-tuner's --preserve_distribution_shape) instead of being squeezed into the range."""
    p = torch.rand(size=(batch_size,), device=device, generator=generator, dtype=torch.float64)
    if sampling == "uniform":
        return lo + (hi - lo) * p
    normal = NormalDist(mean, std)  # plain floats: no tensor to read back under `framer-ds plan`
    low = normal.cdf(math.log(lo / (1 - lo))) if lo > 0 else 0.0
    high = normal.cdf(math.log(hi / (1 - hi))) if hi < 1 else 1.0
    return torch.sigmoid(mean + std * torch.special.ndtri(low + (high - low) * p))


def sample_training_sigmas(
    batch_size: int,
    shift: float,
    sampling: TimestepSampling = "uniform",
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    generator: torch.Generator | None = None,
    num_train_timesteps: int = NUM_TRAIN_TIMESTEPS,
    index_range: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One sigma per sample, shape (batch_size,), float32 on the generator's device (CPU by default).

    u ~ U(0, 1) ("uniform": with the shifted table this is Wan's shifted sampling) or u = sigmoid(N(mean,
    std)) ("logit_normal", SD3 section 3.1); the sigma is the table entry at index floor(u * N), as
    finetrainers' `prepare_sigmas` picks it. The draw order equals diffusers'
    `compute_density_for_timestep_sampling`, so the same generator gives the same sigmas.

    `index_range` [lo, hi) (a Wan 2.2 expert's, `expert_index_range`): the draw is RESAMPLED inside the
    range, i.e. conditioned on landing there (`_unit_draws_in`), not rescaled onto it: an expert then
    sees its noise levels with the weights the full-range sampling gives them, as it would inside a
    run that trained both experts on one draw.
    """
    device = generator.device if generator is not None else torch.device("cpu")
    if index_range is not None:
        lo, hi = index_range
        u = _unit_draws_in(
            lo / num_train_timesteps,
            hi / num_train_timesteps,
            batch_size,
            sampling,
            logit_mean,
            logit_std,
            generator,
            device,
        )
        indices = (u * num_train_timesteps).long().clamp(lo, hi - 1)
        return training_sigma_table(shift, num_train_timesteps).to(device)[indices]
    if sampling == "logit_normal":
        normal = torch.normal(
            mean=logit_mean, std=logit_std, size=(batch_size,), device=device, generator=generator
        )
        u = torch.sigmoid(normal)
    elif sampling == "uniform":
        u = torch.rand(size=(batch_size,), device=device, generator=generator)
    else:
        raise ValueError(f"unknown timestep sampling {sampling!r}; use 'uniform' or 'logit_normal'")
    # sigmoid rounds to exactly 1.0 in float32 for draws above ~17: clamp onto the table's last entry.
    indices = (u * num_train_timesteps).long().clamp(max=num_train_timesteps - 1)
    return training_sigma_table(shift, num_train_timesteps).to(device)[indices]


def sigmas_to_timesteps(sigmas: torch.Tensor, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """The transformer's timestep input: sigma * N as a float, exactly what the diffusers pipeline
    passes at inference (finetrainers truncates to an integer; keeping the float means training and
    sampling feed the same values)."""
    return sigmas * num_train_timesteps


def _per_sample(sigmas: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) sigmas broadcast against a (B, ...) tensor, in its dtype."""
    return sigmas.to(like.dtype).reshape(-1, *([1] * (like.ndim - 1)))


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - sigma) * x0 + sigma * noise (diffusers' `scale_noise`, finetrainers' `flow_match_xt`)."""
    sigma = _per_sample(sigmas, x0)
    return (1.0 - sigma) * x0 + sigma * noise


def flow_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The velocity the transformer predicts: d x_t / d sigma = noise - x0."""
    return noise - x0


def loss_weights(sigmas: torch.Tensor, weighting: LossWeighting = "none") -> torch.Tensor:
    """Per-sample loss weights, diffusers' `compute_loss_weighting_for_sd3`: "none" (ones; Wan and
    finetrainers' default), "sigma_sqrt" (sigma^-2) or "cosmap" (2 / (pi * (1 - 2 s + 2 s^2)))."""
    if weighting == "sigma_sqrt":
        return sigmas.float() ** -2.0
    if weighting == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas + 2 * sigmas**2))
    if weighting == "none":
        return torch.ones_like(sigmas)
    raise ValueError(f"unknown loss weighting {weighting!r}; use 'none', 'sigma_sqrt' or 'cosmap'")


def flow_matching_loss(prediction: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted squared error in float32, the mean over each sample's elements, then over the batch
    (finetrainers' reduction: every sample counts equally whatever its weight's scale)."""
    squared = (prediction.float() - target.float()).pow(2)
    per_sample = (_per_sample(weights.float(), squared) * squared).flatten(1).mean(dim=1)
    return per_sample.mean()


def inference_sigmas(
    num_inference_steps: int, shift: float, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """The sampler's sigmas, num_inference_steps + 1 values ending in 0, float32: diffusers'
    `set_timesteps` on a static-shift scheduler (linspace between the shifted table's ends, shifted
    again, then the terminal 0)."""
    table = training_sigma_table(shift, num_train_timesteps)
    sigma_max, sigma_min = table[0].item(), table[-1].item()
    steps = torch.linspace(
        sigma_max * num_train_timesteps,
        sigma_min * num_train_timesteps,
        num_inference_steps,
        dtype=torch.float64,
    )
    # diffusers computes the linspace in float64 (numpy) and the shift on float64 before casting.
    sigmas = shift_sigmas(steps / num_train_timesteps, shift).to(torch.float32)
    return torch.cat([sigmas, torch.zeros(1)])


def euler_step(
    sample: torch.Tensor,
    velocity: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
) -> torch.Tensor:
    """One Euler step along the predicted velocity: x + (sigma_next - sigma) * v, computed in float32
    and returned in the velocity's dtype (diffusers' `FlowMatchEulerDiscreteScheduler.step`)."""
    return (sample.float() + (sigma_next - sigma) * velocity).to(velocity.dtype)
