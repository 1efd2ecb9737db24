"""Units of the held-out interpolation metrics (framer_ds/tasks/video_lora/shared/interp_metrics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from framer_ds.tasks.video_lora.shared.interp_metrics import (
    centre_indices,
    frame_ssim,
    interpolation_metrics,
    summarize_interp_metrics,
)


def clips(b=3, t=5, h=32, w=40, seed=0) -> torch.Tensor:
    """[B,T,3,H,W] in [-1,1], values kept in [-0.4, 0.4] so added noise does not clip."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, t, 3, h, w, generator=g) * 0.8 - 0.4


def totals(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double().sum(dim=0) for k, v in values.items()}


def test_identical_clips_score_perfectly():
    truth = clips()
    values = interpolation_metrics(truth, truth.clone(), embed=lambda x: x.flatten(1))
    assert torch.all(values["psnr"] == 100.0) and torch.all(values["psnr_mid"] == 100.0)  # capped, finite
    torch.testing.assert_close(values["ssim"], torch.ones(3))
    torch.testing.assert_close(values["clip_distance"], torch.zeros(3), atol=1e-6, rtol=0)
    summary = summarize_interp_metrics(totals(values), 3)
    assert summary["eval/flicker_ratio"] == 1.0 and summary["eval/psnr"] == 100.0


def test_known_gaussian_noise_gives_the_known_psnr():
    truth = clips(b=2, t=5, h=96, w=96)
    sigma = 0.05  # in [0,1] units; 0.1 in the [-1,1] pixels
    noisy = truth + 2 * sigma * torch.randn(truth.shape, generator=torch.Generator().manual_seed(1))
    values = interpolation_metrics(noisy, truth)
    expected = 10 * math.log10(1 / sigma**2)  # 26.02 dB; 0.1 dB is ~4 std of a 27648-pixel MSE
    torch.testing.assert_close(values["psnr"], torch.full((2,), expected), atol=0.1, rtol=0)
    torch.testing.assert_close(values["psnr_ends"], torch.full((2,), expected), atol=0.1, rtol=0)
    # noise on the middle frame only: psnr_mid sees it, psnr_ends does not
    only_mid = truth.clone()
    only_mid[:, 2] = noisy[:, 2]
    values = interpolation_metrics(only_mid, truth)
    torch.testing.assert_close(values["psnr_mid"], torch.full((2,), expected), atol=0.1, rtol=0)
    assert torch.all(values["psnr_ends"] == 100.0)


def test_ssim_matches_a_scipy_reference():
    """Gaussian window 11 (sigma 1.5, scipy truncate 10/3 -> radius 5), valid region, K1 .01, K2 .03."""
    truth = clips(b=1, t=3, h=40, w=48)
    other = (truth + 0.2 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(2))).clamp(-1, 1)
    x, y = ((other[0, 1] + 1) / 2).double().numpy(), ((truth[0, 1] + 1) / 2).double().numpy()

    def blur(z):
        return gaussian_filter(z, 1.5, truncate=10 / 3, mode="constant")[5:-5, 5:-5]

    per_channel = []
    for c in range(3):
        a, b = x[c], y[c]
        mu_a, mu_b = blur(a), blur(b)
        va, vb, cov = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2, blur(a * b) - mu_a * mu_b
        c1, c2 = 0.01**2, 0.03**2
        per_channel.append(
            ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (va + vb + c2))
        )
    expected = float(np.mean(per_channel))
    got = frame_ssim((other[:, 1:2] + 1) / 2, (truth[:, 1:2] + 1) / 2)[0, 0].item()
    assert got == pytest.approx(expected, abs=1e-5)
    assert 0 < got < 0.9


def test_flicker_ratio_is_one_for_the_same_motion_and_zero_for_a_frozen_clip():
    truth = clips()
    brighter = truth + 0.1  # same frame-to-frame change
    assert summarize_interp_metrics(totals(interpolation_metrics(brighter, truth)), 3)[
        "eval/flicker_ratio"
    ] == pytest.approx(1.0, abs=1e-6)
    frozen = truth[:, :1].expand_as(truth).clone()
    assert (
        summarize_interp_metrics(totals(interpolation_metrics(frozen, truth)), 3)["eval/flicker_ratio"] == 0
    )


def test_centre_frames():
    assert centre_indices(7) == [3] and centre_indices(4) == [1, 2]
    with pytest.raises(ValueError, match="at least 3 frames"):
        interpolation_metrics(clips(t=2), clips(t=2))


def test_per_sample_sums_give_the_same_means_however_the_set_is_split():
    truth = clips(b=6, seed=3)
    sample = truth + 0.2 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(4))

    def embed(x):
        return x.mean(dim=(2, 3))

    def summary(splits):
        sums: dict[str, torch.Tensor] = {}
        start = 0
        for size in splits:  # as the loop does: per batch, per rank, summed into float64 totals
            part = interpolation_metrics(sample[start : start + size], truth[start : start + size], embed)
            for k, v in totals(part).items():
                sums[k] = sums[k] + v if k in sums else v
            start += size
        return summarize_interp_metrics(sums, 6)

    whole = summary([6])
    for splits in ([1] * 6, [2, 4], [5, 1]):
        parts = summary(splits)
        assert parts.keys() == whole.keys()
        for k in whole:
            assert parts[k] == pytest.approx(whole[k], rel=1e-6), k
    assert set(whole) == {f"eval/{k}" for k in ("psnr", "psnr_mid", "ssim", "psnr_ends", "clip_distance")} | {
        "eval/flicker_ratio"
    }
