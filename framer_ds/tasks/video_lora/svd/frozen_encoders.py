"""The frozen VAE and CLIP image encoder of a video_lora run.

Why a holder of their own: they never go through `accelerator.prepare` (only one model may, under
DeepSpeed), must be built outside ZeRO-3 init (else ZeRO-3 partitions them), run in the compute dtype
(the VAE in the dtype SVD's VAE tolerates), and with the latent cache on they should leave the device once
the cache is filled: kept on the CPU when sampling rounds will want them again, else dropped.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from framer_ds.engine.accelerator import frozen_model_init
from framer_ds.engine.precision import compute_dtype
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.tasks.video_lora.shared.protocol import FrozenHelpers
from framer_ds.tasks.video_lora.svd.encoding import svd_conditioning


class FrozenSvdEncoders(FrozenHelpers):
    def __init__(self, svd_dir: Path, keep_on_cpu: bool):
        self.svd_dir = svd_dir
        self.keep_on_cpu = keep_on_cpu
        self.vae: torch.nn.Module | None = None
        self.image_encoder: torch.nn.Module | None = None
        self.lent = False  # on the device for an evaluation while the latent cache is on

    def load(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """Fresh (vae, image encoder) through `load_pretrained` (`framer-ds plan` counts them on meta)."""
        from diffusers import AutoencoderKLTemporalDecoder
        from transformers import CLIPVisionModelWithProjection

        vae = load_pretrained(AutoencoderKLTemporalDecoder, self.svd_dir, subfolder="vae")
        encoder = load_pretrained(CLIPVisionModelWithProjection, self.svd_dir, subfolder="image_encoder")
        return vae, encoder

    def on_device(self, accelerator) -> tuple[torch.nn.Module, torch.nn.Module]:
        """Loaded once (frozen, eval), then on the accelerator's device in their compute dtypes."""
        if self.vae is None:
            with frozen_model_init(accelerator):  # frozen helpers must not be partitioned by ZeRO-3
                vae, encoder = self.load()
            for module in (vae, encoder):
                module.requires_grad_(False).eval()
            self.vae, self.image_encoder = vae, encoder
        dtype = compute_dtype(accelerator)
        for module, wanted in (
            (self.vae, svd_conditioning().vae_dtype(self.vae.config, dtype)),
            (self.image_encoder, dtype),
        ):
            module.to(accelerator.device)
            if module.dtype != wanted:  # diffusers warns on every dtype-carrying .to(), even a no-op
                module.to(dtype=wanted)
        return self.vae, self.image_encoder

    def release(self) -> None:
        """Off the device: kept on CPU when sampling will want them again, else dropped."""
        if self.vae is None:
            return
        if self.keep_on_cpu:
            self.vae.to("cpu")
            self.image_encoder.to("cpu")
        else:
            self.vae = self.image_encoder = None
            gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
