"""The Wan family's frozen encoders, the encoded batch it trains on, and its captions.

Why apart from wan.py: these are the pieces the latent cache touches (what an entry holds, which
encoders fill it, which text decides it), while wan.py is the objective and the model.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from framer_ds.engine.accelerator import frozen_model_init
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.tasks.video_lora.shared.protocol import CachedBatch, FrozenHelpers
from framer_ds.tasks.video_lora.wan.preflight import has_image_encoder, image_encoder_class_name


@dataclass
class WanEncodedClip(CachedBatch):
    """One batch as the Wan transformer reads it (and a latent-cache entry stores it, per clip)."""

    target: Tensor  # [B, z, F', h, w] normalised VAE latents (mode): the flow's x0
    condition: Tensor  # [B, 4 + z, F', h, w] frame mask + normalised latents of the given frames
    # (TI2V-5B: [B, z, 1, h, w], the first frame's normalised latents alone; wan/ti2v.py)
    prompt_emb: Tensor  # [B, L, D] UMT5 states, zero past each prompt's length
    # [B, k, T, D] CLIP penultimate states of the first (and last, k=2) frame; None on a base without an
    # image encoder (Wan 2.2 I2V A14B), whose cache entries then hold no such tensor
    image_emb: Tensor | None = None

    def image_tokens(self) -> Tensor | None:
        """[B*k, T, D], first_0, last_0, first_1, ...: the order the FLF2V image embedder pairs."""
        return None if self.image_emb is None else self.image_emb.flatten(0, 1)


class FrozenWanEncoders(FrozenHelpers):
    """The VAE, CLIP image encoder (+ processor; none on Wan 2.2 I2V A14B) and UMT5 text encoder
    (+ tokenizer) of a Wan run.

    Loaded only when something must be encoded (a latent cache with entries left, or no cache) or
    sampled (validation samples, interp_eval), outside ZeRO-3 init, in the compute dtype (the VAE in
    float32: its conditioning latents are compared with the pipeline's); dropped once the cache is
    filled and after each sampling round, so a complete cache never loads UMT5 to train, and sampling
    under it loads UMT5 only for what the cache does not hold (the negative prompt, once a run)."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.vae: torch.nn.Module | None = None
        self.image_encoder: torch.nn.Module | None = None
        self.text_encoder: torch.nn.Module | None = None
        self.image_processor = self.tokenizer = None
        self.lent = False  # on the device for interp_eval while the latent cache is on

    @property
    def with_image_encoder(self) -> bool:
        """Whether the base has a CLIP image encoder (`wan/preflight.has_image_encoder`)."""
        return has_image_encoder(self.base_dir)

    def _load_vae_and_image(self) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """A fresh VAE, and CLIP on a base that has one (None on Wan 2.2 I2V A14B)."""
        import transformers
        from diffusers import AutoencoderKLWan

        vae = load_pretrained(AutoencoderKLWan, self.base_dir, subfolder="vae")
        if not self.with_image_encoder:
            return vae, None
        clip_class = getattr(transformers, image_encoder_class_name(self.base_dir))
        return vae, load_pretrained(clip_class, self.base_dir, subfolder="image_encoder")

    def load(self, text: bool = True) -> tuple[torch.nn.Module, ...]:
        """Fresh (vae, image encoder, text encoder), each only where it applies: no image encoder on a
        base without one, no UMT5 without `text` (`framer-ds plan` counts them on meta, VAE first)."""
        vae, image = self._load_vae_and_image()
        umt5 = self.load_text() if text else None
        return tuple(m for m in (vae, image, umt5) if m is not None)

    def load_text(self) -> torch.nn.Module:
        """A fresh UMT5 text encoder."""
        from transformers import UMT5EncoderModel

        return load_pretrained(UMT5EncoderModel, self.base_dir, subfolder="text_encoder")

    def _modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.vae, self.image_encoder, self.text_encoder) if m is not None]

    def _load_missing(self, text: bool) -> None:
        """The VAE and CLIP (+ processor, where the base has one) unless loaded; with `text`, UMT5
        (+ tokenizer) unless loaded."""
        from transformers import AutoTokenizer

        from framer_ds.compat import image_processor_class

        if self.vae is None:
            vae, image = self._load_vae_and_image()
            self.vae = vae.requires_grad_(False).eval()
            if image is not None:
                self.image_encoder = image.requires_grad_(False).eval()
                processor = image_processor_class("CLIPImageProcessor")
                self.image_processor = processor.from_pretrained(self.base_dir, subfolder="image_processor")
        if text and self.text_encoder is None:
            self.text_encoder = self.load_text().requires_grad_(False).eval()
            self.tokenizer = AutoTokenizer.from_pretrained(self.base_dir, subfolder="tokenizer")

    def on_device(self, accelerator, text: bool = True) -> tuple[torch.nn.Module | None, ...]:
        """Loaded once (frozen, eval, outside ZeRO-3 init), then on the device: the VAE in float32 (the
        pipeline's dtype for it), the encoders in the compute dtype. `text` False: UMT5 only if it is
        loaded already (sampling from cached prompt states)."""
        with frozen_model_init(accelerator):
            self._load_missing(text)
        self._move_to_device(accelerator, self._modules())
        return self.vae, self.image_encoder, self.text_encoder

    def for_sampling(self, device: str) -> FrozenWanEncoders:
        """All of them in float32 on `device`, as `WanImageToVideoPipeline.from_pretrained` loads them."""
        self._load_missing(text=True)
        for module in self._modules():
            module.to(device)
        return self

    def encode_images(self, first: Tensor, last: Tensor | None) -> Tensor | None:
        """CLIP states of the given frames (`wan.conditioning.encode_images`); None without an encoder."""
        if self.image_encoder is None:
            return None
        from framer_ds.tasks.video_lora.wan.conditioning import encode_images

        return encode_images(self.image_encoder, self.image_processor, first, last)

    def release(self) -> None:
        """Dropped: the cache holds what they encode; a sampling round loads them again."""
        self.vae = self.image_encoder = self.text_encoder = None
        self.image_processor = self.tokenizer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
