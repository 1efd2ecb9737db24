"""`framer-ds smoke`'s stand-in for a diffusers Wan image-to-video folder (Wan 2.1 I2V / FLF2V, Wan 2.2
A14B and TI2V-5B): every component its model_index.json lists, from that folder's config.json files at a
tiny width and depth, random, saved through `WanImageToVideoPipeline.save_pretrained` in the same layout.

What stays: the transformer's patch (1, 2, 2), in/out channels (36 = noisy + mask + condition latents),
qk norm, rope length and FLF2V's image position embedding over first + last frame (so the CLIP tower
keeps its 224 px in 14 px patches: 2 x 257 tokens); the VAE's z_dim, its per-channel latent statistics,
8x spatial and 4x temporal compression; UMT5's vocabulary and relative-attention buckets; Wan 2.2's two
experts and boundary_ratio; TI2V-5B's `expand_timesteps` and Wan 2.2 VAE (z_dim 48, its 2 x 2 patch,
16x spatial); the scheduler config as shipped. What shrinks: transformer width 16 (2 heads
of 8) and 2 blocks, VAE base width 8 and one residual block per level, UMT5 width 16 and 2 layers, CLIP
width 16 and 2 layers. The tokenizer is wan/tiny.py's small UMT5-style one (UMT5's is not shipped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from framer_ds.compat import fix_processor_class, image_processor_class
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import read_config
from framer_ds.tasks.video_lora.shared.smoke_encoders import tiny_clip_config

MARKER = ".framer_smoke_wan_complete"
HEADS, HEAD_DIM, TEXT_DIM = 2, 8, 16


def tiny_transformer_config(config: dict[str, Any], image_dim: int | None) -> dict[str, Any]:
    width = HEADS * HEAD_DIM
    return {
        **config,
        "num_attention_heads": HEADS,
        "attention_head_dim": HEAD_DIM,
        "ffn_dim": 2 * width,
        "num_layers": 2,
        "text_dim": TEXT_DIM,
        "freq_dim": 32,
        "image_dim": image_dim if config.get("image_dim") is not None else None,
        "added_kv_proj_dim": width if config.get("added_kv_proj_dim") is not None else None,
    }


def _text_encoder(architecture: Path):
    from transformers import UMT5Config, UMT5EncoderModel

    config = read_config(architecture, "text_encoder")
    for key in ("architectures", "model_type"):
        config.pop(key, None)
    small = {"d_model": TEXT_DIM, "d_kv": 4, "d_ff": 32, "num_layers": 2, "num_decoder_layers": 2}
    return UMT5EncoderModel(UMT5Config(**{**config, **small, "num_heads": 4}))


def _image_encoder(architecture: Path):
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = tiny_clip_config(read_config(architecture, "image_encoder"))
    for key in ("architectures", "model_type"):
        config.pop(key, None)
    return CLIPVisionModelWithProjection(CLIPVisionConfig(**config))


def _scheduler(architecture: Path, index: dict[str, Any]):
    import diffusers

    scheduler_class = getattr(diffusers, index["scheduler"][1])
    return scheduler_class.from_config(read_config(architecture, "scheduler", "scheduler_config.json"))


def build_smoke_pipeline(architecture: Path):
    """The tiny pipeline of the Wan folder `architecture` (see the module docstring)."""
    from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanTransformer3DModel

    from framer_ds.tasks.video_lora.wan.tiny import build_tiny_umt5_tokenizer

    index = json.loads((architecture / "model_index.json").read_text())
    torch.manual_seed(0)
    with_clip = bool(index.get("image_encoder") and index["image_encoder"][0])
    image_encoder = _image_encoder(architecture) if with_clip else None
    image_dim = image_encoder.config.hidden_size if image_encoder is not None else None
    experts = [name for name in ("transformer", "transformer_2") if index.get(name) and index[name][0]]
    transformers = {
        name: WanTransformer3DModel.from_config(
            tiny_transformer_config(read_config(architecture, name), image_dim)
        )
        for name in experts
    }
    vae_config = {**read_config(architecture, "vae"), "base_dim": 8, "num_res_blocks": 1}
    if vae_config.get("decoder_base_dim") is not None:  # Wan 2.2's VAE: its decoder's own width
        vae_config["decoder_base_dim"] = 8
    components: dict[str, Any] = {
        "tokenizer": build_tiny_umt5_tokenizer(),
        "text_encoder": _text_encoder(architecture),
        "vae": AutoencoderKLWan.from_config(vae_config),
        "scheduler": _scheduler(architecture, index),
        **transformers,
    }
    if image_encoder is not None:
        components |= {
            "image_encoder": image_encoder,
            "image_processor": image_processor_class("CLIPImageProcessor")(),
        }
    for key in ("boundary_ratio", "expand_timesteps"):
        if key in index:
            components[key] = index[key]
    return WanImageToVideoPipeline(**components), with_clip


def create_smoke_wan(path: Path, architecture: Path) -> Path:
    """Build (once, atomically) the tiny Wan folder of `architecture` at `path`."""

    def build(staging: Path) -> None:
        pipeline, with_clip = build_smoke_pipeline(architecture)
        pipeline.save_pretrained(staging)
        if with_clip:
            fix_processor_class(staging, "image_processor")

    return build_once(path, MARKER, build, "tiny Wan stand-in")
