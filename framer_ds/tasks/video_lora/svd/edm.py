"""EDM (Karras et al. 2022) objective exactly as Stable Video Diffusion was trained
(docs/architecture.md, "The SVD objective").

SVD is NOT a DDPM-timestep model: its UNet sees `c_in * x_noisy` and `c_noise = 0.25 * ln(sigma)` and
its output F is combined as `denoised = c_skip * x_noisy + c_out * F`. These are the same numbers
diffusers' `EulerDiscreteScheduler` uses at inference with SVD's config (`prediction_type="v_prediction"`,
`timestep_type="continuous"`): `scale_model_input` divides by sqrt(sigma^2+1) (= c_in), the timesteps are
`0.25 * sigma.log()` (= c_noise) and `step` forms `pred_original_sample = F * (-sigma / sqrt(sigma^2+1)) +
sample / (sigma^2+1)` (= c_out, c_skip). Training with these keeps the fine-tune consistent with the sampler.

Everything is computed in float32 whatever the latents' dtype: c_skip/c_out at sigma ~ 700 and the weight
(sigma^2+1)/sigma^2 at sigma ~ 0.002 are badly rounded in bf16. Cast the UNet input to the UNet's dtype.
Pure torch, no diffusers import.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.svd.options import COND_NOISE_MEAN, COND_NOISE_STD, P_MEAN, P_STD


def _randn(batch: int, generator: torch.Generator | None, device: torch.device | str | None) -> Tensor:
    # Draw on the generator's device (a CPU generator cannot fill a CUDA tensor), then move.
    gen_device = generator.device if generator is not None else device
    return torch.randn(batch, generator=generator, device=gen_device, dtype=torch.float32).to(device)


def sample_sigmas(
    batch: int,
    p_mean: float = P_MEAN,
    p_std: float = P_STD,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Training noise levels [B] (float32): ln(sigma) ~ N(p_mean, p_std), the EDM training distribution."""
    return torch.exp(_randn(batch, generator, device) * p_std + p_mean)


def sample_cond_noise_sigma(
    batch: int,
    mean: float = COND_NOISE_MEAN,
    std: float = COND_NOISE_STD,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Per-sample conditioning-augmentation strengths [B]: sigma_cond = exp(N(mean, std)).

    The same value is added (times N(0,1) pixel noise) to the conditioning frame AND passed as the third
    `added_time_ids` entry, which is what the pipeline's `noise_aug_strength` argument does at inference.
    """
    return torch.exp(_randn(batch, generator, device) * std + mean)


def _as_sigma(sigma: Tensor | float) -> Tensor:
    return torch.as_tensor(sigma, dtype=torch.float32).reshape(-1)


def _bcast(x: Tensor, ndim: int) -> Tensor:
    return x.reshape(x.shape[0], *([1] * (ndim - 1)))


def edm_preconditioning(sigma: Tensor | float, ndim: int = 5) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(c_skip, c_out, c_in, c_noise) for noise levels sigma [B].

    c_skip/c_out/c_in come back shaped [B, 1, ..., 1] with `ndim` dims (5 = [B,T,C,H,W] video latents);
    c_noise is [B], the UNet's `timestep` argument (it broadcasts it over frames itself).
    """
    s = _as_sigma(sigma)
    root = torch.sqrt(s * s + 1.0)
    c_skip = 1.0 / (s * s + 1.0)
    c_out = -s / root
    c_in = 1.0 / root
    c_noise = 0.25 * torch.log(s)
    return _bcast(c_skip, ndim), _bcast(c_out, ndim), _bcast(c_in, ndim), c_noise


def edm_loss_weight(sigma: Tensor | float) -> Tensor:
    """lambda(sigma) = (sigma^2+1)/sigma^2 = 1/c_out^2: makes the effective target of F unit-variance."""
    s = _as_sigma(sigma)
    return (s * s + 1.0) / (s * s)


def add_noise(latents: Tensor, sigma: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """x_noisy = x0 + sigma * n, n ~ N(0, I) (float32). EDM adds noise without shrinking x0 (no alpha_t)."""
    gen_device = generator.device if generator is not None else latents.device
    noise = torch.randn(latents.shape, generator=generator, device=gen_device).to(latents.device)
    return latents.float() + _bcast(_as_sigma(sigma).to(latents.device), latents.ndim) * noise


def denoise(unet_output: Tensor, noisy: Tensor, sigma: Tensor | float) -> Tensor:
    """D(x; sigma) = c_skip * x_noisy + c_out * F, in float32 (`noisy` is x_noisy, NOT c_in * x_noisy)."""
    c_skip, c_out, _, _ = edm_preconditioning(sigma, ndim=unet_output.ndim)
    dev = unet_output.device
    return c_skip.to(dev) * noisy.float() + c_out.to(dev) * unet_output.float()


def edm_loss(
    denoised: Tensor,
    target: Tensor,
    sigma: Tensor | float,
    reduction: Literal["mean", "none"] = "mean",
    frame_weights: Tensor | None = None,
) -> Tensor:
    """Per sample: mean over non-batch dims of w(sigma) * (D - x0)^2; "none" -> [B], "mean" -> scalar.

    Averaging (rather than summing) over C,T,H,W keeps the loss scale independent of resolution and frame
    count; the per-sample weight w is what EDM prescribes, so this is the paper's loss up to a constant.
    `frame_weights` [B,T] (video tensors [B,T,C,H,W]) turns the mean over frames into a weighted one, so
    frames without ground truth (image pairs: only the two ends are real) contribute nothing.
    """
    w = edm_loss_weight(sigma).to(denoised.device)
    error = (denoised.float() - target.float()).pow(2)
    if frame_weights is None:
        per_sample = error.flatten(1).mean(dim=1) * w
    else:
        per_frame = error.flatten(2).mean(dim=2)
        weights = frame_weights.to(per_frame)
        per_sample = (per_frame * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-12) * w
    if reduction == "none":
        return per_sample
    if reduction == "mean":
        return per_sample.mean()
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def fixed_sigma_quantiles(
    n: int, p_mean: float = P_MEAN, p_std: float = P_STD, lo: float = 0.1, hi: float = 0.9
) -> Tensor:
    """n deterministic sigmas at evenly spaced quantiles in [lo, hi] of the training lognormal.

    For a held-out loss that does not jitter with the random sigma draw: evaluating every eval sample at
    the same sigmas makes two evaluations comparable. n == 1 gives the median exp(p_mean).
    """
    if n < 1 or not 0.0 < lo <= hi < 1.0:
        raise ValueError(f"need n >= 1 and 0 < lo <= hi < 1, got n={n}, lo={lo}, hi={hi}")
    q = torch.tensor([0.5], dtype=torch.float64) if n == 1 else torch.linspace(lo, hi, n, dtype=torch.float64)
    return torch.exp(p_mean + p_std * torch.special.ndtri(q)).float()
