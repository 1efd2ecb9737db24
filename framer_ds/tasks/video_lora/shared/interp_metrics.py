"""Held-out frame-interpolation metrics: a sampled clip against the real one, per sample.

Every function takes videos `[B, T, 3, H, W]` in [-1, 1] (what the sampler returns and the loader
reads) and returns per-sample values `[B]`, which the training loop sums over the eval set and all
ranks (`Task.eval_step`); `summarize_interp_metrics` turns the totals into `eval/*`. Every value is
computed per clip, so a mean over clips is the same however the set is split between ranks/batches.

Definitions (pixels mapped to [0, 1], data range 1):
- "middle frames" are frames 1 .. T-2: the ones interpolation does not receive.
- `psnr`: per frame 10 log10(1 / MSE) over its pixels and channels, averaged over the middle frames
  of a clip, then over clips (the usual video-interpolation convention: per-frame PSNR, averaged).
  MSE is floored at 1e-10, so an exact frame scores 100 dB instead of making the mean infinite.
- `psnr_mid`: the same for the middle frame only (index T // 2; for even T the mean of the two
  central frames), the single-frame number Framer's paper reports.
- `ssim`: Wang et al. 2004 SSIM with an 11x11 Gaussian window (sigma 1.5; smaller frames get the
  largest odd window that fits), K1 = 0.01, K2 = 0.03, 'valid' filtering (no padding, as the
  reference MATLAB code), averaged over channels and pixels, then over the middle frames.
- `psnr_ends`: PSNR of the first and last frames (given to the model), averaged: how faithfully the
  conditioning frames come back.
- `flicker_ratio`: sum over clips of the sample's temporal-difference energy mean_t mean((x[t+1] -
  x[t])^2) divided by the same sum for the real clips (a ratio of totals, so a static clip does not
  divide by zero): 1 = as much frame-to-frame change as the truth, > 1 flicker, < 1 frozen.
- `clip_distance`: 1 - cosine similarity of CLIP image embeddings (the run's own image encoder)
  between each sampled middle frame and the real one, averaged over the middle frames.
- `lpips`: LPIPS v0.1 (`shared/lpips.py`, from local weight files) between each sampled middle
  frame and the real one, averaged over the middle frames.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

MSE_FLOOR = 1e-10  # PSNR cap: 100 dB
SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03
FLICKER_PARTS = ("flicker_energy_sample", "flicker_energy_truth")


def _unit(video: Tensor) -> Tensor:
    return ((video.float() + 1.0) / 2.0).clamp(0.0, 1.0)


def middle_indices(num_frames: int) -> list[int]:
    if num_frames < 3:
        raise ValueError(
            f"interpolation metrics need at least 3 frames (first, middle, last), got {num_frames}"
        )
    return list(range(1, num_frames - 1))


def centre_indices(num_frames: int) -> list[int]:
    """The middle frame (odd T) or the two central frames (even T)."""
    return [num_frames // 2] if num_frames % 2 else [num_frames // 2 - 1, num_frames // 2]


def frame_psnr(sample: Tensor, truth: Tensor) -> Tensor:
    """[B, T, C, H, W] in [0, 1] -> per-frame PSNR [B, T] in dB (data range 1)."""
    mse = (sample - truth).pow(2).flatten(2).mean(dim=2)
    return -10.0 * torch.log10(mse.clamp_min(MSE_FLOOR))


def _gaussian_window(size: int, sigma: float, channels: int, device, dtype) -> Tensor:
    coords = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def frame_ssim(sample: Tensor, truth: Tensor) -> Tensor:
    """[B, T, C, H, W] in [0, 1] -> per-frame SSIM [B, T] (Gaussian window, valid filtering)."""
    b, t, c, h, w = sample.shape
    size = min(SSIM_WINDOW, h, w)
    size -= 1 - size % 2  # odd
    x, y = sample.reshape(b * t, c, h, w).double(), truth.reshape(b * t, c, h, w).double()
    window = _gaussian_window(size, SSIM_SIGMA, c, x.device, x.dtype)

    def blur(z: Tensor) -> Tensor:
        return F.conv2d(z, window, groups=c)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    c1, c2 = SSIM_K1**2, SSIM_K2**2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return ssim_map.flatten(1).mean(dim=1).view(b, t).float()


def temporal_energy(video: Tensor) -> Tensor:
    """[B, T, C, H, W] -> [B]: mean over frame pairs of the mean squared frame-to-frame change."""
    return (video[:, 1:] - video[:, :-1]).pow(2).flatten(2).mean(dim=2).mean(dim=1)


def clip_distance(embed: Callable[[Tensor], Tensor], sample: Tensor, truth: Tensor) -> Tensor:
    """1 - cos(CLIP(sample frame), CLIP(real frame)) per middle frame, averaged -> [B]. `embed` maps
    [N, 3, H, W] frames in [-1, 1] to [N, D] (or [N, 1, D]) embeddings."""
    b, t = sample.shape[:2]
    frames = torch.cat([sample.flatten(0, 1), truth.flatten(0, 1)])
    features = embed(frames).float().reshape(2, b * t, -1)
    cosine = F.cosine_similarity(features[0], features[1], dim=-1)
    return (1.0 - cosine).view(b, t).mean(dim=1)


def frame_distance(distance: Callable[[Tensor, Tensor], Tensor], sample: Tensor, truth: Tensor) -> Tensor:
    """`distance` ([N, 3, H, W] pairs in [-1, 1] -> [N]) per frame, averaged over the frames -> [B]."""
    b, t = sample.shape[:2]
    return distance(sample.flatten(0, 1).float(), truth.flatten(0, 1).float()).view(b, t).mean(dim=1)


def interpolation_metrics(
    sample: Tensor,
    truth: Tensor,
    embed: Callable[[Tensor], Tensor] | None = None,
    perceptual: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> dict[str, Tensor]:
    """Per-sample values ([B] each) for one batch of sampled vs real clips (both [B, T, 3, H, W] in
    [-1, 1]); `embed` (the run's CLIP image encoder) adds `clip_distance`, `perceptual` (LPIPS) `lpips`."""
    if sample.shape != truth.shape:
        raise ValueError(f"sample {tuple(sample.shape)} and truth {tuple(truth.shape)} differ in shape")
    num_frames = sample.shape[1]
    middle = middle_indices(num_frames)
    x, y = _unit(sample), _unit(truth)
    psnr = frame_psnr(x, y)
    values = {
        "psnr": psnr[:, middle].mean(dim=1),
        "psnr_mid": psnr[:, centre_indices(num_frames)].mean(dim=1),
        "ssim": frame_ssim(x[:, middle], y[:, middle]).mean(dim=1),
        "psnr_ends": psnr[:, [0, num_frames - 1]].mean(dim=1),
        FLICKER_PARTS[0]: temporal_energy(x),
        FLICKER_PARTS[1]: temporal_energy(y),
    }
    if embed is not None:
        values["clip_distance"] = clip_distance(embed, sample[:, middle], truth[:, middle])
    if perceptual is not None:
        values["lpips"] = frame_distance(perceptual, sample[:, middle], truth[:, middle])
    return values


def summarize_interp_metrics(sums: dict[str, Tensor], num_samples: int) -> dict[str, float]:
    """Totals over the eval set -> `eval/*`: means per clip, and the flicker ratio of the two energy
    totals. Keys that are not interpolation metrics are left to the caller."""
    out: dict[str, float] = {}
    for name in ("psnr", "psnr_mid", "ssim", "psnr_ends", "clip_distance", "lpips"):
        if name in sums:
            out[f"eval/{name}"] = sums[name].double().item() / max(num_samples, 1)
    if all(part in sums for part in FLICKER_PARTS):
        truth = sums[FLICKER_PARTS[1]].double().item()
        sample = sums[FLICKER_PARTS[0]].double().item()
        out["eval/flicker_ratio"] = sample / truth if truth > 0 else (1.0 if sample == 0 else math.inf)
    return out


INTERP_METRIC_KEYS = ("psnr", "psnr_mid", "ssim", "psnr_ends", "clip_distance", "lpips", *FLICKER_PARTS)
