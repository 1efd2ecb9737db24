"""What the Wan transformer is conditioned on, computed exactly as diffusers' `WanImageToVideoPipeline`
(0.42.1) computes it, so training, the latent cache and `sample_video` feed the transformer the tensors
the pipeline feeds it:

- prompts: UMT5 last hidden states, each prompt's positions past its own length zeroed, padded to
  `max_sequence_length` (`_get_t5_prompt_embeds`);
- images: CLIP vision penultimate hidden states (`encode_image`), first + last frame interleaved per sample
  for FLF2V (the pipeline's `encode_image([image, last_image])`);
- the video condition: the 4-channel first/last-frame mask concatenated with the normalised VAE mode of
  [first, zeros..., (last)] (`prepare_latents`);
- the training target: normalised VAE latents of the clip (finetrainers' `WanLatentEncodeProcessor`).

Pixels enter as [-1, 1] tensors (the task's video convention); where diffusers starts from a PIL image,
the [-1, 1] tensor is what its `VideoProcessor.preprocess` makes of that image.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any, Literal

import ftfy
import numpy as np
import regex
import torch

LatentPosterior = Literal["mode", "sample"]


def prompt_clean(text: str) -> str:
    """diffusers' Wan `prompt_clean`: ftfy's mojibake fix, HTML entities unescaped twice, whitespace runs
    collapsed to one space, stripped (the pipeline's `basic_clean` + `whitespace_clean`)."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip()


@torch.no_grad()
def encode_prompts(
    text_encoder: torch.nn.Module, tokenizer: Any, prompts: list[str], max_sequence_length: int = 512
) -> torch.Tensor:
    """UMT5 embeddings [B, max_sequence_length, D] in the text encoder's dtype, on its device.

    diffusers' `_get_t5_prompt_embeds`: cleaned prompts tokenised to `max_sequence_length` (truncated,
    "</s>" appended), encoded with the attention mask, then every position past a prompt's own token
    count set to exactly zero, so the transformer's cross-attention sees zeros rather than the encoder's
    outputs at padding (Wan was trained that way; an unzeroed cache would change its outputs)."""
    cleaned = [prompt_clean(prompt) for prompt in prompts]
    tokens = tokenizer(
        cleaned,
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    device = next(text_encoder.parameters()).device
    mask = tokens.attention_mask
    lengths = mask.gt(0).sum(dim=1).long()
    hidden = text_encoder(tokens.input_ids.to(device), mask.to(device)).last_hidden_state
    kept = [row[:length] for row, length in zip(hidden, lengths, strict=True)]
    return torch.stack(
        [torch.cat([row, row.new_zeros(max_sequence_length - row.size(0), row.size(1))]) for row in kept]
    )


def to_uint8_images(images: torch.Tensor) -> list[np.ndarray]:
    """[B, 3, H, W] in [-1, 1] -> B uint8 HWC arrays: the pixels a PIL image holds, so CLIP's processor
    resizes exactly what the pipeline's PIL input would give it (rounded, not truncated)."""
    pixels = ((images.detach().float().cpu() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return list(pixels.permute(0, 2, 3, 1).numpy())


@torch.no_grad()
def encode_images(
    image_encoder: torch.nn.Module,
    image_processor: Any,
    images: torch.Tensor,
    last_images: torch.Tensor | None = None,
) -> torch.Tensor:
    """CLIP penultimate hidden states (`hidden_states[-2]`, diffusers' `encode_image`), image encoder dtype.

    images [B, 3, H, W] in [-1, 1] -> [B, T, D] (I2V). With `last_images` (FLF2V) -> [2B, T, D] ordered
    first_0, last_0, first_1, last_1, ...: the pipeline encodes `[image, last_image]` as two images and
    the FLF2V transformer's image embedder views them as [B, 2T, D] (first then last frame tokens) before
    adding its positional embedding, so this order is the only one that pairs each sample's own frames
    (for a batch of one image pair repeated B times it equals the pipeline's `repeat(B, 1, 1)`)."""
    if last_images is not None:
        if last_images.shape != images.shape:
            raise ValueError(
                f"last_images {tuple(last_images.shape)} must match images {tuple(images.shape)}"
            )
        images = torch.stack([images, last_images], dim=1).flatten(0, 1)
    device = next(image_encoder.parameters()).device
    inputs = image_processor(images=to_uint8_images(images), return_tensors="pt").to(device)
    return image_encoder(**inputs, output_hidden_states=True).hidden_states[-2]


def _latent_stats(vae_config: Mapping[str, Any], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(latents_mean, 1 / latents_std) shaped [1, z, 1, 1, 1], as the pipeline builds them (it multiplies
    by the reciprocal rather than dividing: kept, so the floats are the pipeline's)."""
    z_dim = vae_config["z_dim"]
    mean = torch.tensor(vae_config["latents_mean"]).view(1, z_dim, 1, 1, 1).to(like.device, like.dtype)
    inv_std = 1.0 / torch.tensor(vae_config["latents_std"]).view(1, z_dim, 1, 1, 1).to(
        like.device, like.dtype
    )
    return mean, inv_std


def normalize_latents(latents: torch.Tensor, vae_config: Mapping[str, Any]) -> torch.Tensor:
    """VAE latents -> the transformer's space: (x - latents_mean) * (1 / latents_std) per channel."""
    mean, inv_std = _latent_stats(vae_config, latents)
    return (latents - mean) * inv_std


def denormalize_latents(latents: torch.Tensor, vae_config: Mapping[str, Any]) -> torch.Tensor:
    """The inverse, as the pipeline decodes: x / (1 / latents_std) + latents_mean."""
    mean, inv_std = _latent_stats(vae_config, latents)
    return latents / inv_std + mean


def frame_mask(
    batch: int, num_frames: int, height: int, width: int, temporal: int, with_last: bool
) -> torch.Tensor:
    """The pipeline's 4-channel frame mask [B, temporal, F', h, w] (float32): 1 on given frames (the
    first; and the last for FLF2V), 0 elsewhere, the first frame repeated `temporal` times so every
    latent frame owns `temporal` pixel-frame flags (the VAE's first latent frame covers one pixel frame)."""
    mask = torch.ones(batch, 1, num_frames, height, width)
    mask[:, :, 1 : num_frames - 1 if with_last else num_frames] = 0
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=temporal)
    mask = torch.concat([first, mask[:, :, 1:]], dim=2)
    return mask.view(batch, -1, temporal, height, width).transpose(1, 2)


@torch.no_grad()
def condition_latents(
    vae: torch.nn.Module, first: torch.Tensor, last: torch.Tensor | None, num_frames: int
) -> torch.Tensor:
    """The transformer's extra input channels [B, temporal + z, F', h, w], float32: `prepare_latents`'s
    `condition` = concat(frame mask, normalised VAE mode of the video [first, zeros..., last?]).

    first/last [B, 3, H, W] in [-1, 1]; I2V when `last` is None (first frame then num_frames - 1 zero
    frames), FLF2V otherwise (first, num_frames - 2 zeros, last). The pipeline takes the VAE's mode
    (`sample_mode="argmax"`), not a sample, for the condition."""
    if (num_frames - 1) % vae.config.scale_factor_temporal:
        raise ValueError(
            f"num_frames {num_frames} must be 1 + a multiple of {vae.config.scale_factor_temporal} "
            "(the VAE's temporal compression)"
        )
    batch, channels, height, width = first.shape
    given = [first.unsqueeze(2)]
    zeros = num_frames - (1 if last is None else 2)
    given.append(first.new_zeros(batch, channels, zeros, height, width))
    if last is not None:
        given.append(last.unsqueeze(2))
    param = next(vae.parameters())
    video = torch.cat(given, dim=2).to(device=param.device, dtype=param.dtype)
    latent = vae.encode(video).latent_dist.mode().to(torch.float32)
    latent = normalize_latents(latent, vae.config)
    spatial = vae.config.scale_factor_spatial
    mask = frame_mask(
        batch,
        num_frames,
        height // spatial,
        width // spatial,
        vae.config.scale_factor_temporal,
        last is not None,
    )
    return torch.concat([mask.to(latent.device), latent], dim=1)


@torch.no_grad()
def encode_video_latents(
    vae: torch.nn.Module,
    video: torch.Tensor,
    posterior: LatentPosterior = "mode",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The training target: video [B, 3, F, H, W] in [-1, 1] -> normalised latents [B, z, F', h, w].

    "mode" (default) is deterministic, so a cached latent equals a fresh one; "sample" draws
    mean + std * N(0, 1) with `generator` (diffusers' `DiagonalGaussianDistribution.sample`) and then
    normalises. finetrainers trains Wan on a seeded posterior sample (`WanModelSpecification.forward`
    samples the cached moments per step; it normalises mean AND log-variance with latents_mean/std
    before sampling, a quirk not copied here). Wan's VAE posterior is narrow, so the two differ little."""
    param = next(vae.parameters())
    distribution = vae.encode(video.to(device=param.device, dtype=param.dtype)).latent_dist
    if posterior == "mode":
        latents = distribution.mode()
    elif posterior == "sample":
        latents = distribution.sample(generator=generator)
    else:
        raise ValueError(f"unknown posterior {posterior!r}; use 'mode' or 'sample'")
    return normalize_latents(latents, vae.config)
