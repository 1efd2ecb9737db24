"""Conditioning for SVD training batches, built EXACTLY as `StableVideoDiffusionPipeline.__call__` builds it.

A fine-tune that conditions differently from the pipeline (a plain interpolate instead of the antialiased
resize, scaled conditioning latents, fps instead of fps-1, ...) trains a model the stock pipeline then
feeds different inputs. Each function names the pipeline code it mirrors;
tests/tasks/video_lora/svd/test_svd_objective.py checks them against the pipeline's own methods on a
tiny model.

Frames are float tensors in [-1, 1] (the range `video_processor.preprocess` produces). The frozen encoders
run under `torch.no_grad()`: nothing here is trained, and no graph is kept for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from diffusers.pipelines.stable_video_diffusion.pipeline_stable_video_diffusion import (
    _resize_with_antialiasing,
)
from diffusers.utils.torch_utils import randn_tensor
from torch import Tensor
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from framer_ds.tasks.video_lora.svd.edm import edm_preconditioning

CLIP_SIZE = (224, 224)  # hard-coded in the pipeline's `_encode_image`


class _TiledEncoder:
    """What `AutoencoderKL._tiled_encode` reads from `self`, taken from a temporal-decoder VAE (same
    `Encoder` + `quant_conv`), so both VAEs tile with diffusers' own overlap-and-blend code."""

    def __init__(self, vae: torch.nn.Module, tile_size: int):
        from diffusers import AutoencoderKL

        self._tiled_encode = AutoencoderKL._tiled_encode.__get__(self)
        self.blend_v = AutoencoderKL.blend_v.__get__(self)
        self.blend_h = AutoencoderKL.blend_h.__get__(self)
        self.encoder, self.quant_conv = vae.encoder, vae.quant_conv
        self.config = SimpleNamespace(use_quant_conv=True)
        self.tile_sample_min_size = tile_size
        self.tile_latent_min_size = tile_size // 2 ** (len(vae.config.block_out_channels) - 1)
        self.tile_overlap_factor = 0.25


def vae_posterior(vae: torch.nn.Module, images: Tensor, tile_size: int | None = None):
    """`vae.encode(images).latent_dist`, in overlapping tiles when a side exceeds `tile_size` pixels.

    Why not `vae.enable_tiling()`: `AutoencoderKLTemporalDecoder.encode` ignores it (and slicing) and
    encodes the whole batch at full size. Tiles are encoded separately and blended, so tiled latents
    differ slightly from untiled ones (as with diffusers' tiled AutoencoderKL); use it only when a
    frame does not fit otherwise.
    """
    if tile_size is None or max(images.shape[-2:]) <= tile_size:
        return vae.encode(images).latent_dist
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    return DiagonalGaussianDistribution(_TiledEncoder(vae, tile_size)._tiled_encode(images))


def vae_dtype(vae_config, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the frozen VAE runs in: the pipeline's `needs_upcasting` (the SVD VAE overflows in fp16,
    so with `config.force_upcast` it encodes in fp32). Training and `framer-ds sample` both use this, so
    a sample conditions on latents encoded as the training ones were."""
    if compute_dtype == torch.float16 and getattr(vae_config, "force_upcast", False):
        return torch.float32
    return compute_dtype


def _per_sample(value: Tensor | float, batch: int, device: torch.device | str | None = None) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.float32, device=device).reshape(-1)
    return t.expand(batch) if t.numel() == 1 else t


@torch.no_grad()
def clip_image_embeddings(
    image_encoder: torch.nn.Module,
    first_frames: Tensor,
    image_mean: Sequence[float] = OPENAI_CLIP_MEAN,
    image_std: Sequence[float] = OPENAI_CLIP_STD,
) -> Tensor:
    """[B,3,H,W] frames in [-1,1] -> CLIP image embeddings [B,1,D] in the encoder's dtype.

    Mirrors `_encode_image` for a PIL input: `_resize_with_antialiasing` to 224x224 on the [-1,1] image
    (it resizes before mapping back to [0,1] "to match the original implementation"), then
    `feature_extractor(do_normalize=True, do_resize=False, do_rescale=False, do_center_crop=False)`,
    which is exactly (x - image_mean) / image_std; done here in torch so it stays on the device (pass
    `feature_extractor.image_mean/image_std`; the defaults are SVD's OpenAI-CLIP values). Note the
    pipeline skips the resize for *tensor* inputs, so only its PIL path is a valid reference.
    """
    x = _resize_with_antialiasing(first_frames.float(), CLIP_SIZE)
    x = (x + 1.0) / 2.0
    mean = torch.tensor(image_mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(image_std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    x = (x - mean) / std
    dtype = next(image_encoder.parameters()).dtype
    return image_encoder(x.to(dtype)).image_embeds.unsqueeze(1)


@torch.no_grad()
def conditioning_latents(
    vae: torch.nn.Module,
    frames: Tensor,
    noise_aug_sigma: Tensor | float,
    generator: torch.Generator | list[torch.Generator] | None = None,
    tile_size: int | None = None,
) -> Tensor:
    """[B,3,H,W] conditioning frames in [-1,1] -> UNSCALED latents [B,C,h,w] (VAE dtype).

    Mirrors `__call__` step 4 + `_encode_vae_image`: `image + noise_aug_strength * randn` in pixel space
    (drawn with diffusers' `randn_tensor`, so a seeded generator gives the pipeline's very noise), then
    `vae.encode(image).latent_dist.mode()` with NO `scaling_factor` (SVD was trained on unscaled
    conditioning latents). `noise_aug_sigma`: a float or per-sample [B] tensor (`sample_cond_noise_sigma`).
    """
    frames = frames.float()
    noise = randn_tensor(frames.shape, generator=generator, device=frames.device, dtype=frames.dtype)
    sigma = _per_sample(noise_aug_sigma, frames.shape[0], frames.device).view(-1, 1, 1, 1)
    image = (frames + sigma * noise).to(dtype=vae.dtype)
    return vae_posterior(vae, image, tile_size).mode()


@torch.no_grad()
def target_latents(
    vae: torch.nn.Module,
    video: Tensor,
    chunk_size: int | None = None,
    sample: bool = True,
    generator: torch.Generator | list[torch.Generator] | None = None,
    tile_size: int | None = None,
) -> Tensor:
    """[B,T,3,H,W] video in [-1,1] -> SCALED latents [B,T,C,h,w] (x0 of the diffusion loss).

    `latent_dist.sample() * vae.config.scaling_factor` per frame: the inverse of the pipeline's
    `decode_latents` (which divides by scaling_factor). `sample=True` by default because the latent model
    was trained on posterior samples (Stability's `DiagonalGaussianRegularizer(sample=True)`, diffusers'
    train_text_to_image `.latent_dist.sample()`); `sample=False` uses the mode for a deterministic eval
    loss. `chunk_size` frames are encoded at a time to bound activation memory (the encoder is per-frame,
    so chunking changes nothing else; 1 is what diffusers calls slicing); `tile_size`: `vae_posterior`.
    """
    b, t = video.shape[:2]
    flat = video.flatten(0, 1).to(dtype=vae.dtype)
    step = chunk_size or flat.shape[0]
    parts = []
    for i in range(0, flat.shape[0], step):
        dist = vae_posterior(vae, flat[i : i + step], tile_size)
        parts.append(dist.sample(generator=generator) if sample else dist.mode())
    latents = torch.cat(parts) * vae.config.scaling_factor
    return latents.reshape(b, t, *latents.shape[1:])


def added_time_ids(
    fps: Tensor | float,
    motion_bucket_id: Tensor | float,
    noise_aug_strength: Tensor | float,
    batch: int,
    unet: torch.nn.Module,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """[B,3] micro-conditioning `[fps - 1, motion_bucket_id, noise_aug_strength]` per sample.

    Mirrors `__call__` (which does `fps = fps - 1`, because SVD was micro-conditioned on fps-1, see its
    NOTE) + `_get_add_time_ids` (order and the `add_embedding.linear_1.in_features` check). Pass the
    clip's real fps: the pipeline called with `fps=f` then reproduces the training conditioning. Each
    value may be a float or a per-sample [B] tensor (the noise-aug strength is per sample in training).
    """
    expected = unet.add_embedding.linear_1.in_features
    passed = unet.config.addition_time_embed_dim * 3
    if expected != passed:
        raise ValueError(
            f"UNet expects an added time embedding of length {expected}, but 3 ids x addition_time_embed_dim "
            f"= {passed}; the UNet config is inconsistent (check addition_time_embed_dim and "
            "projection_class_embeddings_input_dim)."
        )
    values = (fps, motion_bucket_id, noise_aug_strength)
    if device is None:  # follow a tensor argument's device so CPU floats and CUDA tensors can mix
        device = next((v.device for v in values if isinstance(v, Tensor)), None)
    fps_t, motion, aug = (_per_sample(v, batch, device) for v in values)
    return torch.stack([fps_t - 1.0, motion, aug], dim=1).to(dtype=dtype)


def conditioning_dropout(
    image_emb: Tensor,
    cond_latents: Tensor,
    p_image: float,
    p_latents: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Zero each sample's image embedding w.p. `p_image` and its conditioning latents w.p. `p_latents`.

    Zero is the unconditional input the pipeline's classifier-free guidance uses
    (`torch.zeros_like(image_embeddings)` / `torch.zeros_like(image_latents)`). The two drops are
    INDEPENDENT per sample, as in Stability's generative-models `GeneralConditioner` (one Bernoulli
    `ucg_rate` per embedder). So both are zero together (the pipeline's unconditional branch) w.p.
    p_image * p_latents; diffusers' InstructPix2Pix-derived SVD scripts instead couple them via one
    uniform draw. Returns new tensors; shapes and dtypes are unchanged.
    """
    b = image_emb.shape[0]
    gen_device = generator.device if generator is not None else image_emb.device
    u = torch.rand(2, b, generator=generator, device=gen_device).to(image_emb.device)
    keep_img = (u[0] >= p_image).to(image_emb.dtype).view(b, *([1] * (image_emb.ndim - 1)))
    keep_lat = (u[1] >= p_latents).to(cond_latents.dtype).view(b, *([1] * (cond_latents.ndim - 1)))
    return image_emb * keep_img, cond_latents * keep_lat.to(cond_latents.device)


def interpolation_conditioning(
    first_latents: Tensor, last_latents: Tensor, num_frames: int
) -> tuple[Tensor, Tensor]:
    """Framer-style first+last-frame conditioning: (cond [B,T,C,h,w], mask [B,T,1,h,w]).

    Frame 0 carries `first_latents`, frame T-1 `last_latents` (both as from `conditioning_latents`:
    unscaled), the unknown middle frames a zero placeholder (the same "no information" value CFG uses).
    The mask is 1 on given frames so the UNet can tell a given frame from the placeholder; concatenated
    with noisy latents and cond it makes 4+4+1 = 9 input channels, so the UNet's conv_in must be widened.
    """
    if num_frames < 2:
        raise ValueError(f"interpolation needs num_frames >= 2 (first and last), got {num_frames}")
    if first_latents.shape != last_latents.shape:
        raise ValueError(f"first/last latents differ in shape: {first_latents.shape} vs {last_latents.shape}")
    b, c, h, w = first_latents.shape
    cond = first_latents.new_zeros(b, num_frames, c, h, w)
    cond[:, 0] = first_latents
    cond[:, -1] = last_latents
    mask = first_latents.new_zeros(b, num_frames, 1, h, w)
    mask[:, 0] = 1.0
    mask[:, -1] = 1.0
    return cond, mask


def unet_denoise(
    unet: torch.nn.Module,
    noisy: Tensor,
    sigma: Tensor,
    cond_latents: Tensor,
    image_embeddings: Tensor,
    time_ids: Tensor,
) -> Tensor:
    """EDM denoiser D(x; sigma) through the SVD UNet (float32 result), as one pipeline step does it.

    `scale_model_input` (c_in * noisy; the conditioning latents are NOT scaled), `torch.cat([..., image_
    latents], dim=2)` with cond repeated over frames when given as [B,C,h,w], timestep c_noise =
    0.25 ln sigma, then `c_skip * noisy + c_out * F` (the v-prediction `pred_original_sample`). For
    interpolation pass `torch.cat([cond, mask], dim=2)` as `cond_latents` (a UNet with 9 input channels).
    """
    c_skip, c_out, c_in, c_noise = edm_preconditioning(sigma.to(noisy.device), ndim=noisy.ndim)
    dtype = next(unet.parameters()).dtype
    if cond_latents.ndim == 4:
        cond_latents = cond_latents.unsqueeze(1).expand(-1, noisy.shape[1], -1, -1, -1)
    model_in = torch.cat([(c_in * noisy.float()).to(dtype), cond_latents.to(dtype)], dim=2)
    out = unet(
        model_in,
        c_noise,  # float32 like the scheduler's timesteps; the UNet's time_proj casts its output itself
        encoder_hidden_states=image_embeddings.to(dtype),
        added_time_ids=time_ids.to(dtype),
        return_dict=False,
    )[0]
    return c_skip * noisy.float() + c_out * out.float()
