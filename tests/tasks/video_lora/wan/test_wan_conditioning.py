"""Wan conditions (framer_ds/tasks/video_lora/wan/conditioning.py) against diffusers' own
`WanImageToVideoPipeline` methods on the tiny Wan bases: prompt and image embeddings, the video condition
and the latent normalisation. Tolerances: the same float32 operations on the same modules, so equality up
to float32 rounding of batched vs single-sample kernels (1e-6 on unit-scale values); a wrong layer, mask
frame or normalisation moves values by ~1e-1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import WanImageToVideoPipeline
from diffusers.pipelines.wan import pipeline_wan_i2v

from framer_ds.tasks.video_lora.wan.conditioning import (
    condition_latents,
    denormalize_latents,
    encode_images,
    encode_prompts,
    encode_video_latents,
    frame_mask,
    normalize_latents,
    prompt_clean,
)

PROMPTS = ["  a red ball &amp;amp; a   cat\n jumps ", "The camera pans left \u00e2\u0080\u0094 slowly"]


@pytest.fixture(scope="module")
def pipes(tiny_wan_bases: dict[str, Path]) -> dict[str, WanImageToVideoPipeline]:
    return {mode: WanImageToVideoPipeline.from_pretrained(folder) for mode, folder in tiny_wan_bases.items()}


def _image(seed: int) -> PIL.Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def _pixels(pipe: WanImageToVideoPipeline, image: PIL.Image.Image) -> torch.Tensor:
    """The [-1, 1] tensor the pipeline makes of a PIL image (its VideoProcessor.preprocess)."""
    return pipe.video_processor.preprocess(image, height=64, width=64).to(torch.float32)


def test_prompt_clean_is_diffusers() -> None:
    """ftfy repairs mojibake ("\u00e2\u0080\u0094" -> an em dash), entities are unescaped twice and whitespace
    collapsed: each differs from the raw prompt, and each equals diffusers' prompt_clean."""
    for prompt in [*PROMPTS, "x\u3000y\u00a0z", "plain"]:
        assert prompt_clean(prompt) == pipeline_wan_i2v.prompt_clean(prompt)
    assert prompt_clean(PROMPTS[0]) == "a red ball & a cat jumps"
    assert prompt_clean(PROMPTS[1]) == "The camera pans left \u2014 slowly"


def test_prompt_embeddings_equal_the_pipelines(pipes: dict[str, WanImageToVideoPipeline]) -> None:
    pipe = pipes["flf2v"]
    ours = encode_prompts(pipe.text_encoder, pipe.tokenizer, PROMPTS, max_sequence_length=24)
    with torch.no_grad():
        expected = pipe._get_t5_prompt_embeds(PROMPTS, max_sequence_length=24, device=torch.device("cpu"))
    assert ours.shape == (2, 24, pipe.text_encoder.config.d_model)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    lengths = pipe.tokenizer([prompt_clean(p) for p in PROMPTS]).input_ids
    for row, ids in zip(ours, lengths, strict=True):
        assert row[len(ids) :].abs().max() == 0 and row[: len(ids)].abs().min() > 0
    # negative prompt "" (the pipeline's default): one "</s>" token, the rest zeros
    empty = encode_prompts(pipe.text_encoder, pipe.tokenizer, [""], max_sequence_length=24)
    assert empty[0, 1:].abs().max() == 0 and empty[0, 0].abs().max() > 0


def test_image_embeddings_equal_the_pipelines(pipes: dict[str, WanImageToVideoPipeline]) -> None:
    """I2V: one image -> [B, T, D]; FLF2V: the pipeline's encode_image([image, last]) repeated for the
    batch, i.e. first/last interleaved per sample, and a different pair per sample stays paired."""
    first, last, other = _image(0), _image(1), _image(2)
    i2v = pipes["i2v"]
    ours = encode_images(i2v.image_encoder, i2v.image_processor, _pixels(i2v, first))
    torch.testing.assert_close(ours, i2v.encode_image(first, torch.device("cpu")), rtol=0, atol=1e-6)

    flf2v = pipes["flf2v"]
    firsts = torch.cat([_pixels(flf2v, first), _pixels(flf2v, other)])
    lasts = torch.cat([_pixels(flf2v, last), _pixels(flf2v, first)])
    ours = encode_images(flf2v.image_encoder, flf2v.image_processor, firsts, lasts)
    with torch.no_grad():
        pair0 = flf2v.encode_image([first, last], torch.device("cpu"))
        pair1 = flf2v.encode_image([other, first], torch.device("cpu"))
    assert ours.shape[0] == 4
    torch.testing.assert_close(ours, torch.cat([pair0, pair1]), rtol=0, atol=1e-6)
    repeated = encode_images(
        flf2v.image_encoder,
        flf2v.image_processor,
        firsts[:1].repeat(2, 1, 1, 1),
        lasts[:1].repeat(2, 1, 1, 1),
    )
    torch.testing.assert_close(repeated, pair0.repeat(2, 1, 1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["i2v", "flf2v"])
def test_condition_equals_prepare_latents(pipes: dict[str, WanImageToVideoPipeline], mode: str) -> None:
    """mask [B, 4, F', h, w] + normalised VAE mode of [first, zeros, (last)], batch 2, as prepare_latents."""
    pipe = pipes[mode]
    first = _pixels(pipe, _image(0))
    last = _pixels(pipe, _image(1)) if mode == "flf2v" else None
    with torch.no_grad():
        _, expected = pipe.prepare_latents(
            first,
            2,
            16,
            64,
            64,
            9,
            torch.float32,
            torch.device("cpu"),
            torch.Generator().manual_seed(0),
            None,
            last,
        )
    ours = condition_latents(
        pipe.vae, first.repeat(2, 1, 1, 1), None if last is None else last.repeat(2, 1, 1, 1), 9
    )
    assert ours.shape == (2, 4 + 16, 3, 8, 8) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    # the mask: latent frame 0 all given; the last latent frame's last flag only for FLF2V
    mask = ours[:, :4]
    assert mask[:, :, 0].min() == 1 and mask[:, :, 1].max() == 0
    assert mask[:, :3, 2].max() == 0 and mask[:, 3, 2].min() == (1 if mode == "flf2v" else 0)


def test_condition_refuses_a_frame_count_the_vae_cannot_hold(
    pipes: dict[str, WanImageToVideoPipeline],
) -> None:
    first = torch.zeros(1, 3, 64, 64)
    with pytest.raises(ValueError, match="num_frames 8 must be 1 \\+ a multiple of 4"):
        condition_latents(pipes["i2v"].vae, first, None, 8)


def test_frame_mask_layout() -> None:
    """9 frames, 4x temporal: 12 flags (first repeated 4x) viewed as 3 latent frames x 4 channels."""
    mask = frame_mask(1, 9, 1, 1, 4, with_last=True)[0, :, :, 0, 0].T.flatten().tolist()
    assert mask == [1, 1, 1, 1] + [0] * 7 + [1]
    assert frame_mask(1, 9, 1, 1, 4, with_last=False).sum() == 4


def test_video_latents_are_the_normalised_vae_posterior(pipes: dict[str, WanImageToVideoPipeline]) -> None:
    """The training target: normalised mode (deterministic), or a seeded sample around it; the
    normalisation round-trips and equals the pipeline's arithmetic."""
    vae = pipes["i2v"].vae
    video = torch.rand(2, 3, 9, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    mode = encode_video_latents(vae, video)
    with torch.no_grad():
        raw = vae.encode(video).latent_dist
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    torch.testing.assert_close(mode, (raw.mode() - mean) * (1.0 / std), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        denormalize_latents(normalize_latents(raw.mode(), vae.config), vae.config), raw.mode()
    )
    one = encode_video_latents(vae, video, "sample", torch.Generator().manual_seed(3))
    two = encode_video_latents(vae, video, "sample", torch.Generator().manual_seed(3))
    torch.testing.assert_close(one, two, rtol=0, atol=0)
    assert (one - mode).abs().max() > 0
    with pytest.raises(ValueError, match="use 'mode' or 'sample'"):
        encode_video_latents(vae, video, "mean")  # type: ignore[arg-type]
