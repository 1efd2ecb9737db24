"""SVD objective (EDM) and conditioning, checked against formulas and against diffusers' own pipeline code."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline

from framer_ds.tasks.video_lora.svd.conditioning import (
    added_time_ids,
    clip_image_embeddings,
    conditioning_dropout,
    conditioning_latents,
    interpolation_conditioning,
    target_latents,
    unet_denoise,
)
from framer_ds.tasks.video_lora.svd.edm import (
    add_noise,
    denoise,
    edm_loss,
    edm_loss_weight,
    edm_preconditioning,
    fixed_sigma_quantiles,
    sample_cond_noise_sigma,
    sample_sigmas,
)
from framer_ds.tasks.video_lora.svd.tiny import (
    MARKER,
    SVD_SCHEDULER_CONFIG,
    create_tiny_svd,
    load_svd_components,
)

SIZE = 64  # pixels; the tiny VAE downsamples 8x like the real one -> 8x8 latents


@pytest.fixture(scope="module")
def svd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_svd(tmp_path_factory.mktemp("svd") / "tiny-svd")


@pytest.fixture(scope="module")
def parts(svd_dir: Path) -> SimpleNamespace:
    unet, vae, image_encoder, feature_extractor = load_svd_components(svd_dir, torch.float32)
    return SimpleNamespace(unet=unet, vae=vae, image_encoder=image_encoder, fe=feature_extractor)


@pytest.fixture(scope="module")
def pipe(svd_dir: Path) -> StableVideoDiffusionPipeline:
    p = StableVideoDiffusionPipeline.from_pretrained(svd_dir)
    p.set_progress_bar_config(disable=True)
    return p


def _pil_and_frames(h: int, w: int) -> tuple[PIL.Image.Image, torch.Tensor]:
    arr = np.random.default_rng(h * w).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    frames = torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255.0 * 2.0 - 1.0
    return PIL.Image.fromarray(arr), frames


@pytest.fixture(scope="module")
def pil_and_frames() -> tuple[PIL.Image.Image, torch.Tensor]:
    return _pil_and_frames(SIZE, SIZE)


# ---------------------------------------------------------------- EDM


# sigma: (c_skip, c_out, c_in, c_noise, weight), by hand from docs/architecture.md, "The SVD objective"
HAND = {
    0.5: (0.8, -0.4472135955, 0.8944271910, -0.1732867951, 5.0),
    1.0: (0.5, -0.7071067812, 0.7071067812, 0.0, 2.0),
    2.0: (0.2, -0.8944271910, 0.4472135955, 0.1732867951, 1.25),
    10.0: (1 / 101, -0.9950371902, 0.0995037190, 0.5756462732, 1.01),
}


def test_preconditioning_and_weight_match_hand_values() -> None:
    sigma = torch.tensor(list(HAND))
    c_skip, c_out, c_in, c_noise = edm_preconditioning(sigma)
    assert c_skip.shape == c_out.shape == c_in.shape == (4, 1, 1, 1, 1)
    assert c_noise.shape == (4,)
    expected = torch.tensor(list(HAND.values()))
    got = torch.stack([c_skip.flatten(), c_out.flatten(), c_in.flatten(), c_noise, edm_loss_weight(sigma)], 1)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_edm_matches_svd_euler_scheduler() -> None:
    """The EDM of docs/architecture.md and diffusers' SVD sampler (v-prediction, continuous
    timesteps) are the same maths."""
    sched = EulerDiscreteScheduler(**SVD_SCHEDULER_CONFIG)
    sched.set_timesteps(5)
    x, f = torch.randn(1, 2, 4, 3, 3), torch.randn(1, 2, 4, 3, 3)
    for t, sigma in zip(sched.timesteps, sched.sigmas[:-1], strict=True):
        _, _, c_in, c_noise = edm_preconditioning(sigma)
        torch.testing.assert_close(c_noise, t.reshape(1).float(), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(sched.scale_model_input(x, t), c_in * x)
        sched._step_index = None  # step() locates sigma from t
        x0 = sched.step(f, t, x).pred_original_sample
        torch.testing.assert_close(x0, denoise(f, x, sigma), atol=1e-5, rtol=1e-5)


def test_sigma_sampling_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    log_s = sample_sigmas(200_000, 0.7, 1.6, generator=g).log()
    assert abs(log_s.mean().item() - 0.7) < 0.02 and abs(log_s.std().item() - 1.6) < 0.02
    again = sample_sigmas(8, 0.7, 1.6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, sample_sigmas(8, 0.7, 1.6, generator=torch.Generator().manual_seed(1)))
    log_c = sample_cond_noise_sigma(200_000, generator=g).log()
    assert abs(log_c.mean().item() + 3.0) < 0.01 and abs(log_c.std().item() - 0.5) < 0.01


def test_fixed_quantiles_deterministic_monotonic() -> None:
    q = fixed_sigma_quantiles(5, 0.7, 1.6)
    assert torch.equal(q, fixed_sigma_quantiles(5, 0.7, 1.6))
    assert bool((q[1:] > q[:-1]).all())
    ref = [math.exp(0.7 + 1.6 * NormalDist().inv_cdf(p)) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    torch.testing.assert_close(q, torch.tensor(ref), rtol=1e-5, atol=0)
    assert fixed_sigma_quantiles(1).item() == pytest.approx(math.exp(0.7))
    with pytest.raises(ValueError):
        fixed_sigma_quantiles(0)


def test_perfect_network_gives_x0_and_zero_loss() -> None:
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(6, 3, 4, 5, 5, generator=g)
    sigma = torch.tensor([0.002, 0.05, 0.5, 2.0, 30.0, 700.0])
    noisy = add_noise(x0, sigma, generator=g)
    c_skip, c_out, _, _ = edm_preconditioning(sigma)
    perfect = (x0 - c_skip * noisy) / c_out
    torch.testing.assert_close(denoise(perfect, noisy, sigma), x0, atol=2e-4, rtol=1e-5)
    assert edm_loss(x0, x0, sigma).item() == 0.0
    per_sample = edm_loss(x0 + 1.0, x0, sigma, reduction="none")  # squared error 1 everywhere -> w
    torch.testing.assert_close(per_sample, edm_loss_weight(sigma))


# ---------------------------------------------------------------- conditioning == pipeline


def test_image_embeddings_match_pipeline(parts, pipe) -> None:
    # Larger than 224 and not square: only then does the antialiasing blur of the resize matter.
    pil, frames = _pil_and_frames(320, 448)
    ref = pipe._encode_image(pil, "cpu", 1, False)
    ours = clip_image_embeddings(parts.image_encoder, frames, parts.fe.image_mean, parts.fe.image_std)
    assert ours.shape == ref.shape == (1, 1, 32)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # What the seeds did (a raw interpolate, no CLIP normalisation) is measurably different.
    raw = torch.nn.functional.interpolate(frames, size=(224, 224), mode="bicubic", align_corners=True)
    assert (parts.image_encoder(raw).image_embeds[:, None] - ref).abs().max() > 1e-2


def test_vae_latents_match_pipeline(parts, pipe, pil_and_frames) -> None:
    pil, frames = pil_and_frames
    image = pipe.video_processor.preprocess(pil, height=SIZE, width=SIZE)
    torch.testing.assert_close(image, frames, atol=1e-6, rtol=0)
    # The pipeline's step 4 with noise_aug_strength 0.02 and a seeded generator, then _encode_vae_image.
    g = torch.Generator().manual_seed(3)
    noise = torch.randn(image.shape, generator=g)
    ref = pipe._encode_vae_image(image + 0.02 * noise, "cpu", 1, False)
    ours = conditioning_latents(parts.vae, frames, 0.02, generator=torch.Generator().manual_seed(3))
    assert ours.shape == ref.shape == (1, 4, SIZE // 8, SIZE // 8)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # Conditioning latents are the unscaled mode; target latents are scaled, the inverse of decode_latents.
    mode = parts.vae.encode(frames).latent_dist.mode()
    torch.testing.assert_close(conditioning_latents(parts.vae, frames, 0.0), mode)
    video = torch.cat([frames, -frames, frames.flip(-1)])[None]  # [1, 3, 3, H, W]
    tgt = target_latents(parts.vae, video, chunk_size=2, sample=False)
    assert tgt.shape == (1, 3, 4, SIZE // 8, SIZE // 8)
    assert parts.vae.config.scaling_factor == pytest.approx(0.18215)
    torch.testing.assert_close(tgt[:, 0], mode * parts.vae.config.scaling_factor)
    decoded = pipe.decode_latents(tgt, num_frames=3)
    direct = parts.vae.decode(tgt[0] / parts.vae.config.scaling_factor, num_frames=3).sample
    torch.testing.assert_close(decoded[0].permute(1, 0, 2, 3), direct, atol=1e-5, rtol=1e-5)
    sampled = target_latents(parts.vae, video, sample=True, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == tgt.shape and not torch.equal(sampled, tgt)


def test_added_time_ids_match_pipeline(parts, pipe) -> None:
    ref = pipe._get_add_time_ids(7 - 1, 127, 0.02, torch.float32, 2, 1, False)  # __call__ passes fps - 1
    ours = added_time_ids(7, 127, 0.02, batch=2, unet=parts.unet)
    assert ours.shape == (2, 3)
    torch.testing.assert_close(ours, ref)
    per_sample = added_time_ids(torch.tensor([7.0, 25.0]), 127, torch.tensor([0.1, 0.2]), 2, parts.unet)
    torch.testing.assert_close(per_sample, torch.tensor([[6.0, 127.0, 0.1], [24.0, 127.0, 0.2]]))
    bad = SimpleNamespace(
        add_embedding=SimpleNamespace(linear_1=SimpleNamespace(in_features=100)),
        config=SimpleNamespace(addition_time_embed_dim=32),
    )
    with pytest.raises(ValueError, match="added time embedding"):
        added_time_ids(7, 127, 0.02, 1, bad)


def test_pipeline_call_feeds_unet_what_we_build(parts, pipe, pil_and_frames) -> None:
    """Capture the UNet inputs of a real pipeline call: embeddings, cond latents and time ids are ours."""
    pil, frames = pil_and_frames
    seen: dict[str, torch.Tensor] = {}

    def grab(module, args, kwargs):
        seen.update(sample=args[0], emb=kwargs["encoder_hidden_states"], ids=kwargs["added_time_ids"])

    handle = pipe.unet.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        pipe(pil, height=SIZE, width=SIZE, num_frames=2, num_inference_steps=1, fps=7, motion_bucket_id=50,
             noise_aug_strength=0.05, max_guidance_scale=1.0, generator=torch.Generator().manual_seed(5),
             output_type="latent")  # fmt: skip
    finally:
        handle.remove()
    cond = conditioning_latents(parts.vae, frames, 0.05, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        seen["sample"][:, :, 4:], cond[:, None].expand(-1, 2, -1, -1, -1), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        seen["emb"], clip_image_embeddings(parts.image_encoder, frames), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(seen["ids"], added_time_ids(7, 50, 0.05, 1, parts.unet))


# ---------------------------------------------------------------- training sanity


def test_edm_loss_through_tiny_unet_is_finite_and_trainable(parts) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    video = torch.rand(2, 4, 3, SIZE, SIZE, generator=g) * 2 - 1
    x0 = target_latents(parts.vae, video, chunk_size=3, generator=g)
    aug = sample_cond_noise_sigma(2, generator=g)
    cond = conditioning_latents(parts.vae, video[:, 0], aug, generator=g)
    emb = clip_image_embeddings(parts.image_encoder, video[:, 0])
    ids = added_time_ids(7, 127, aug, 2, parts.unet)
    sigma = fixed_sigma_quantiles(2)
    noisy = add_noise(x0, sigma, generator=g)
    unet = copy.deepcopy(parts.unet).train()  # the module-scoped UNet stays untouched
    opt = torch.optim.Adam(unet.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        loss = edm_loss(unet_denoise(unet, noisy, sigma, cond, emb, ids), x0, sigma)
        assert loss.ndim == 0 and torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.9, losses


# ---------------------------------------------------------------- interpolation, dropout


def test_interpolation_conditioning() -> None:
    first, last = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    cond, mask = interpolation_conditioning(first, last, 5)
    assert cond.shape == (2, 5, 4, 3, 3) and mask.shape == (2, 5, 1, 3, 3)
    assert torch.equal(cond[:, 0], first) and torch.equal(cond[:, -1], last)
    assert not cond[:, 1:-1].any()
    assert torch.equal(mask[:, :, 0, 0, 0], torch.tensor([[1.0, 0, 0, 0, 1]] * 2))
    assert bool((mask == mask[..., :1, :1]).all())
    with pytest.raises(ValueError):
        interpolation_conditioning(first, last, 1)


def test_conditioning_dropout_rates() -> None:
    n = 40_000
    emb, lat = torch.ones(n, 1, 4), torch.ones(n, 4, 2, 2)
    e, c = conditioning_dropout(emb, lat, 0.1, 0.2, generator=torch.Generator().manual_seed(0))
    dropped_e = (e.flatten(1) == 0).all(1)
    dropped_c = (c.flatten(1) == 0).all(1)
    assert bool(((e.flatten(1) == 1).all(1) | dropped_e).all())  # whole samples, never partial
    assert abs(dropped_e.float().mean().item() - 0.1) < 0.01
    assert abs(dropped_c.float().mean().item() - 0.2) < 0.01
    assert abs((dropped_e & dropped_c).float().mean().item() - 0.02) < 0.005  # independent drops
    e2, _ = conditioning_dropout(emb, lat, 0.1, 0.2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(e, e2)
    e0, c0 = conditioning_dropout(emb, lat, 0.0, 1.0)
    assert torch.equal(e0, emb) and not c0.any()


# ---------------------------------------------------------------- tiny checkpoint


def test_tiny_svd_layout_idempotent_and_fast(svd_dir: Path, parts) -> None:
    for sub in ("unet", "vae", "image_encoder", "feature_extractor", "scheduler"):
        assert (svd_dir / sub).is_dir()
    index = json.loads((svd_dir / "model_index.json").read_text())
    assert index["_class_name"] == "StableVideoDiffusionPipeline"
    assert index["feature_extractor"] == ["transformers", "CLIPImageProcessor"]
    stamp = (svd_dir / MARKER).stat().st_mtime_ns
    assert create_tiny_svd(svd_dir) == svd_dir and (svd_dir / MARKER).stat().st_mtime_ns == stamp
    sched = EulerDiscreteScheduler.from_pretrained(svd_dir, subfolder="scheduler")
    assert sched.config.prediction_type == "v_prediction" and sched.config.use_karras_sigmas
    assert sched.config.timestep_type == "continuous"
    assert parts.unet.config.in_channels == 8
    x = torch.randn(1, 4, 8, 8, 8)
    with torch.no_grad():
        parts.unet(x, torch.tensor([0.1]), torch.randn(1, 1, 32), torch.tensor([[6.0, 127.0, 0.02]]))
        start = time.perf_counter()
        parts.unet(x, torch.tensor([0.1]), torch.randn(1, 1, 32), torch.tensor([[6.0, 127.0, 0.02]]))
    assert time.perf_counter() - start < 1.0


def test_tiny_svd_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "something").write_text("")
    with pytest.raises(FileExistsError):
        create_tiny_svd(tmp_path / "x")


def test_frame_weighted_edm_loss_ignores_unweighted_frames() -> None:
    target, sigma = torch.randn(2, 5, 4, 3, 3), torch.tensor([0.5, 2.0])
    denoised = target + 0.1 * torch.randn_like(target)
    weights = torch.tensor([[1.0, 0, 0, 0, 1]] * 2)
    loss = edm_loss(denoised, target, sigma, "none", frame_weights=weights)
    scrambled = denoised.clone()
    scrambled[:, 1:-1] += 100.0  # frames without ground truth may hold anything
    torch.testing.assert_close(edm_loss(scrambled, target, sigma, "none", frame_weights=weights), loss)
    ends = torch.stack([denoised[:, 0], denoised[:, -1]], 1), torch.stack([target[:, 0], target[:, -1]], 1)
    torch.testing.assert_close(loss, edm_loss(*ends, sigma, "none"))  # = the plain loss over the two ends
    ones = torch.ones(2, 5)
    torch.testing.assert_close(
        edm_loss(denoised, target, sigma, frame_weights=ones), edm_loss(denoised, target, sigma)
    )


def test_pair_encoding_supervises_only_the_two_real_frames(parts) -> None:
    from framer_ds.tasks.video_lora.svd.encoding import FrozenEncoders, encode_clips, encode_pairs

    pairs = torch.rand(2, 2, 3, SIZE, SIZE) * 2 - 1
    fps, cond_sigma = torch.full((2,), 7.0), torch.full((2,), 0.05)
    encoders = FrozenEncoders(parts.vae, parts.image_encoder, chunk_size=4)
    encoded = encode_pairs(encoders, pairs, 5, fps, cond_sigma, torch.Generator().manual_seed(0))
    assert encoded.target.shape == (2, 5, 4, SIZE // 8, SIZE // 8)
    assert torch.equal(encoded.frame_weights, torch.tensor([[1.0, 0, 0, 0, 1]] * 2))
    ends = encode_clips(encoders, pairs, fps, cond_sigma, True, torch.Generator().manual_seed(0))
    torch.testing.assert_close(encoded.target[:, 0], ends.target[:, 0])
    torch.testing.assert_close(encoded.target[:, -1], ends.target[:, 1])
    torch.testing.assert_close(encoded.target[:, 2], (ends.target[:, 0] + ends.target[:, 1]) / 2)
    cond, mask = encoded.unet_conditioning(5)
    torch.testing.assert_close(cond[:, 0], ends.first)
    torch.testing.assert_close(cond[:, -1], ends.last)
    assert mask[:, :, 0, 0, 0].tolist() == [[1.0, 0, 0, 0, 1]] * 2


def test_vae_tiling_really_tiles(parts) -> None:
    """`AutoencoderKLTemporalDecoder.encode` ignores diffusers' enable_tiling; ours must not."""
    video = torch.rand(1, 2, 3, SIZE, SIZE) * 2 - 1
    whole = target_latents(parts.vae, video, sample=False)
    calls: list[tuple[int, ...]] = []
    hook = parts.vae.encoder.register_forward_pre_hook(
        lambda module, args: calls.append(tuple(args[0].shape))
    )
    try:
        tiled = target_latents(parts.vae, video, sample=False, tile_size=32)
        assert target_latents(parts.vae, video, sample=False, tile_size=SIZE).equal(whole)  # fits: no tiles
    finally:
        hook.remove()
    assert tiled.shape == whole.shape
    assert len(calls) == 1 + 9 and max(shape[-1] for shape in calls[:9]) == 32  # 3x3 tiles of <= 32 px
    assert not tiled.equal(whole)
    # the top-left tile is not blended with any other: it is the encoding of the 32x32 crop alone
    corner = target_latents(parts.vae, video[..., :32, :32].contiguous(), sample=False)
    torch.testing.assert_close(tiled[..., :3, :3], corner[..., :3, :3])
