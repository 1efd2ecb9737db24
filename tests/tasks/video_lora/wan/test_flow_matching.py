"""The flow-matching objective and Euler sampler, checked against diffusers' own scheduler and training
utilities (`FlowMatchEulerDiscreteScheduler` with Wan's shift, `compute_density_for_timestep_sampling`,
`compute_loss_weighting_for_sd3`), in-process.

Tolerance 1e-6: both sides compute the same float32 expressions on values of order 1 (sigmas in [0, 1],
unit-variance latents), so they differ by a few float32 ulps (~1e-7) at most; a wrong convention (sign of
the target, an unshifted or doubly shifted sigma, an off-by-one step) moves values by 1e-3 or more.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.training_utils import (
    compute_density_for_timestep_sampling,
    compute_loss_weighting_for_sd3,
)

from framer_ds.tasks.video_lora.wan.flow_matching import (
    WAN_SHIFT_480P,
    WAN_SHIFT_720P,
    euler_step,
    expert_index_range,
    flow_matching_loss,
    flow_target,
    inference_sigmas,
    loss_weights,
    noisy_latents,
    sample_training_sigmas,
    shift_sigmas,
    sigmas_to_timesteps,
    training_sigma_table,
)

TOL = 1e-6
SHIFTS = [1.0, WAN_SHIFT_480P, WAN_SHIFT_720P]


def _latents(seed: int, shape=(2, 16, 3, 4, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


@pytest.mark.parametrize("shift", SHIFTS)
def test_training_table_is_the_schedulers_sigmas(shift: float) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    torch.testing.assert_close(training_sigma_table(shift), scheduler.sigmas, rtol=0, atol=TOL)
    # The transformer's timestep is sigma * 1000 exactly as the scheduler computes it (bit-equal).
    torch.testing.assert_close(
        sigmas_to_timesteps(training_sigma_table(shift)), scheduler.timesteps, rtol=0, atol=0
    )


def test_shift_moves_sigmas_towards_noise() -> None:
    sigmas = torch.tensor([0.0, 0.25, 0.5, 1.0])
    shifted = shift_sigmas(sigmas, WAN_SHIFT_720P)
    assert shifted[0] == 0 and shifted[-1] == 1
    assert shifted[2].item() == pytest.approx(5 * 0.5 / (1 + 4 * 0.5))
    assert bool((shifted[1:-1] > sigmas[1:-1]).all())


@pytest.mark.parametrize("sampling", ["uniform", "logit_normal"])
def test_training_sigmas_follow_diffusers_density(sampling: str) -> None:
    """The same generator gives the same draws as diffusers' density, then finetrainers' table lookup."""
    ours = sample_training_sigmas(64, WAN_SHIFT_480P, sampling, 0.0, 1.0, torch.Generator().manual_seed(3))
    u = compute_density_for_timestep_sampling(
        sampling, 64, logit_mean=0.0, logit_std=1.0, generator=torch.Generator().manual_seed(3)
    )
    table = FlowMatchEulerDiscreteScheduler(shift=WAN_SHIFT_480P).sigmas
    torch.testing.assert_close(ours, table[(u * 1000).long()], rtol=0, atol=TOL)
    assert ours.unique().numel() > 32  # really a spread of sigmas, not one value


def test_logit_normal_extreme_draw_stays_in_the_table() -> None:
    """sigmoid(N(0, 100)) rounds to 1.0 for most draws; the index must not run past the table."""
    sigmas = sample_training_sigmas(256, 1.0, "logit_normal", 0.0, 100.0, torch.Generator().manual_seed(0))
    assert float(sigmas.min()) >= 1e-3 and float(sigmas.max()) <= 1.0


@pytest.mark.parametrize("shift", SHIFTS)
def test_noisy_latents_equal_scale_noise(shift: float) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    x0, noise = _latents(0)
    sigmas = scheduler.sigmas[torch.tensor([10, 700])]
    expected = scheduler.scale_noise(x0, scheduler.timesteps[torch.tensor([10, 700])], noise)
    torch.testing.assert_close(noisy_latents(x0, noise, sigmas), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("shift", [WAN_SHIFT_480P, WAN_SHIFT_720P])
def test_target_is_the_velocity_diffusers_steps_along(shift: float) -> None:
    """With the training target as the model output, diffusers' Euler step from x_t(sigma_i) lands on
    x_t(sigma_{i+1}) of the same x0 and noise, at every step of the Wan schedule down to the clean x0: the
    target is the velocity the sampler integrates (a wrong sign or x0 - noise target lands far off)."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(4)
    x0, noise = _latents(1, shape=(1, 16, 3, 4, 4))
    target = flow_target(x0, noise)
    torch.testing.assert_close(target, noise - x0)
    sample = noisy_latents(x0, noise, scheduler.sigmas[:1])
    for index, timestep in enumerate(scheduler.timesteps):
        sample = scheduler.step(target, timestep, sample).prev_sample
        expected = noisy_latents(x0, noise, scheduler.sigmas[index + 1 : index + 2])
        torch.testing.assert_close(sample, expected, rtol=0, atol=TOL)
    torch.testing.assert_close(sample, x0, rtol=0, atol=TOL)


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("steps", [2, 3, 50])
def test_inference_sigmas_equal_set_timesteps(shift: float, steps: int) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    torch.testing.assert_close(inference_sigmas(steps, shift), scheduler.sigmas, rtol=0, atol=TOL)


def test_euler_sampler_equals_scheduler_step() -> None:
    """A whole 3-step sampling loop with an arbitrary velocity field (not the exact one): our steps and
    diffusers' stay equal to 1e-6 at every step, in float32 and for bf16 model outputs."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=WAN_SHIFT_480P)
    scheduler.set_timesteps(3)
    sigmas = inference_sigmas(3, WAN_SHIFT_480P)
    ours = theirs = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    for index, timestep in enumerate(scheduler.timesteps):
        velocity = torch.tanh(ours) * 0.7 + timestep / 1000  # stands in for the transformer
        theirs = scheduler.step(velocity, timestep, theirs).prev_sample
        ours = euler_step(ours, velocity, sigmas[index], sigmas[index + 1])
        torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL)
    bf16 = FlowMatchEulerDiscreteScheduler(shift=WAN_SHIFT_480P)
    bf16.set_timesteps(3)
    velocity = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(4)).bfloat16()
    expected = bf16.step(velocity, bf16.timesteps[0], ours).prev_sample
    got = euler_step(ours, velocity, sigmas[0], sigmas[1])
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=0)


@pytest.mark.parametrize("weighting", ["none", "sigma_sqrt", "cosmap"])
def test_loss_weights_equal_diffusers(weighting: str) -> None:
    sigmas = torch.tensor([0.05, 0.3, 0.7, 1.0])
    expected = compute_loss_weighting_for_sd3(weighting, sigmas=sigmas)
    torch.testing.assert_close(loss_weights(sigmas, weighting), expected, rtol=TOL, atol=0)


def test_unknown_choices_name_the_options() -> None:
    with pytest.raises(ValueError, match="'uniform' or 'logit_normal'"):
        sample_training_sigmas(2, 1.0, "lognormal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'none', 'sigma_sqrt' or 'cosmap'"):
        loss_weights(torch.ones(2), "snr")  # type: ignore[arg-type]


def test_loss_is_finetrainers_reduction() -> None:
    """weights * (pred - target)^2, mean over each sample, then over the batch; zero at the target."""
    x0, noise = _latents(5)
    target = flow_target(x0, noise)
    weights = torch.tensor([1.0, 3.0])
    prediction = target + torch.stack([torch.full_like(x0[0], 0.5), torch.full_like(x0[0], 1.0)])
    expected = (1.0 * 0.25 + 3.0 * 1.0) / 2
    assert flow_matching_loss(prediction, target, weights).item() == pytest.approx(expected, abs=TOL)
    assert flow_matching_loss(target.bfloat16(), target, weights).dtype == torch.float32
    assert flow_matching_loss(target, target, weights).item() == 0.0


@pytest.mark.parametrize("shift", [WAN_SHIFT_480P, WAN_SHIFT_720P])
def test_expert_ranges_split_the_table_where_the_pipeline_switches(shift: float) -> None:
    """Wan 2.2's switch is `t >= boundary_ratio * num_train_timesteps` on the scheduler's timesteps: the
    high-noise expert's indices are exactly the scheduler table's entries with t >= 900, the low-noise
    expert's the rest, together the whole table."""
    timesteps = FlowMatchEulerDiscreteScheduler(shift=shift).timesteps
    high, low = expert_index_range(shift, 0.9, "high_noise"), expert_index_range(shift, 0.9, "low_noise")
    assert high[0] == 0 and high[1] == low[0] and low[1] == len(timesteps)
    assert bool((timesteps[: high[1]] >= 900).all()) and bool((timesteps[high[1] :] < 900).all())
    for ratio in (0.5, 0.875, 0.9, 0.95):  # the float32 torch table splits the same way
        timesteps = sigmas_to_timesteps(training_sigma_table(shift))
        assert expert_index_range(shift, ratio, "low_noise")[0] == int((timesteps >= ratio * 1000).sum())


@pytest.mark.parametrize("sampling", ["uniform", "logit_normal"])
@pytest.mark.parametrize("expert", ["high_noise", "low_noise"])
def test_expert_sigmas_are_the_full_draw_resampled_inside_the_range(sampling: str, expert: str) -> None:
    """Every drawn sigma lies in the expert's range, distributed as the full-range draw conditioned on
    the range (rejection sampling; musubi-tuner's --preserve_distribution_shape), not squeezed into it.
    Compared as table indices: two-sample Kolmogorov-Smirnov distance of 200k restricted draws against
    the full draws that land in the range (>= 40k here). At alpha = 1e-3 the KS critical value is
    1.95 * sqrt(1/n + 1/m) <= 0.011; 0.015 leaves room, while rescaling u into the range instead (the
    other option) moves the logit-normal CDF by > 0.1."""
    shift, n = WAN_SHIFT_480P, 200_000
    lo, hi = expert_index_range(shift, 0.9, expert)
    table = training_sigma_table(shift)
    kwargs = {"logit_mean": 0.0, "logit_std": 1.0}
    ranged = sample_training_sigmas(
        n, shift, sampling, generator=torch.Generator().manual_seed(0), index_range=(lo, hi), **kwargs
    )
    generator = torch.Generator().manual_seed(1)
    full = sample_training_sigmas(n * 2, shift, sampling, generator=generator, **kwargs)
    inside = full[(full <= table[lo]) & (full >= table[hi - 1])]
    assert len(inside) >= 40_000
    assert bool(((ranged <= table[lo]) & (ranged >= table[hi - 1])).all())
    grid = table[lo:hi].flip(0)  # ascending sigmas of the range

    def cdf(draws: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(draws.sort().values, grid, right=True) / len(draws)

    assert float((cdf(ranged) - cdf(inside)).abs().max()) < 0.015
