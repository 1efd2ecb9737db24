"""The LTX-2 family's frozen encoders and the encoded batch it trains on (what a latent-cache entry holds).

Why apart from family.py: these are the pieces the latent cache touches (what an entry holds, which
encoders fill it), while family.py is the objective and the model.
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


@dataclass
class Ltx2EncodedClip(CachedBatch):
    """One batch as the LTX-2 transformer reads it (and a latent-cache entry stores it, per clip)."""

    target: Tensor  # [B, C, F', h, w] normalised VAE latents (mode): the flow's x0
    first: Tensor  # [B, C, 1, h, w] the first frame encoded alone (after the CRF): latent frame 0
    video_prompt: Tensor  # [B, L, Dv] the connectors' video prompt states
    audio_prompt: (
        Tensor  # [B, L, Da] the connectors' audio prompt states (the frozen audio branch reads them)
    )
    prompt_mask: Tensor  # [B, L] their attention mask
    fps: Tensor  # [B] the clip's frame rate (source fps / stride): its positions' time scale (frame_rate.py)
    last: Tensor | None = None  # [B, C, 1, h, w] interpolation: the last frame, a keyframe


class FrozenLtx2Encoders(FrozenHelpers):
    """The video VAE, Gemma 3 (+ tokenizer) and the text connectors of an LTX-2 run: loaded outside ZeRO-3
    init only when something must be encoded (the cache has entries left, or is off), the VAE in float32
    (its latents are compared with the pipeline's), released once the cache is filled."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.vae: torch.nn.Module | None = None
        self.text_encoder: torch.nn.Module | None = None
        self.connectors: torch.nn.Module | None = None
        self.tokenizer = None
        self.lent = False

    def load(self) -> tuple[torch.nn.Module, ...]:
        """Fresh (vae, text encoder, connectors): `framer-ds plan` counts them on meta, the VAE first."""
        from diffusers import AutoencoderKLLTX2Video
        from diffusers.pipelines.ltx2 import LTX2TextConnectors
        from transformers import Gemma3ForConditionalGeneration

        vae = load_pretrained(AutoencoderKLLTX2Video, self.base_dir, subfolder="vae")
        text = load_pretrained(Gemma3ForConditionalGeneration, self.base_dir, subfolder="text_encoder")
        connectors = load_pretrained(LTX2TextConnectors, self.base_dir, subfolder="connectors")
        return vae, text, connectors

    def _modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.vae, self.text_encoder, self.connectors) if m is not None]

    def on_device(self, accelerator) -> tuple[torch.nn.Module | None, ...]:
        """Loaded once (frozen, eval, outside ZeRO-3 init), then on the device: the VAE in float32, Gemma
        and the connectors in the compute dtype."""
        from transformers import AutoTokenizer

        if self.vae is None:
            with frozen_model_init(accelerator):
                self.vae, self.text_encoder, self.connectors = (
                    m.requires_grad_(False).eval() for m in self.load()
                )
            self.tokenizer = AutoTokenizer.from_pretrained(self.base_dir, subfolder="tokenizer")
        self._move_to_device(accelerator, self._modules())
        return self.vae, self.text_encoder, self.connectors

    def release(self) -> None:
        """Dropped: the cache holds what they encode."""
        self.vae = self.text_encoder = self.connectors = self.tokenizer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
