"""`framer-ds smoke`'s stand-in for a diffusers LTX-2 folder: every component its model_index.json lists,
from that folder's config.json files at a tiny width and depth, random, saved through
`LTX2ImageToVideoPipeline.save_pretrained` in the same layout.

What stays: the VAE's latent channels, 4 px pixel patches and its explicit 32x spatial / 8x temporal
compression (LTX-2's size and frame-count rules), the transformer's in/out and audio channels, patch,
RoPE settings and qk norm, the audio VAE's mel bins, latent and base channels (so the audio tokens keep
their width), the connectors' learnable registers, the scheduler config as shipped. What shrinks:
transformer width 16 (2 heads of 8; audio 2 of 4) and 2 blocks, VAE blocks 32 times narrower with one
layer, connectors one layer of width 16, Gemma 3 to ltx2/tiny.py's 2-layer one with its local
tokenizer (Gemma's is not shipped), the vocoder to width 64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import read_config

MARKER = ".framer_smoke_ltx2_complete"


def _transformer(config: dict[str, Any], text_dim: int) -> dict[str, Any]:
    small = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 8, "cross_attention_dim": 16}
    small |= {"audio_num_attention_heads": 2, "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8}
    return {**config, **small, "caption_channels": text_dim}


def _vae(config: dict[str, Any]) -> dict[str, Any]:
    """Every block 32 times narrower (the decoder's up blocks divide their width by the upsampling factor,
    so the widths keep their ratios), one layer each."""
    return {
        **config,
        "block_out_channels": [max(1, c // 32) for c in config["block_out_channels"]],
        "layers_per_block": [1] * len(config["layers_per_block"]),
        "decoder_block_out_channels": [max(1, c // 32) for c in config["decoder_block_out_channels"]],
        "decoder_layers_per_block": [1] * len(config["decoder_layers_per_block"]),
    }


def _connectors(config: dict[str, Any], text_dim: int, layers: int) -> dict[str, Any]:
    small = {"caption_channels": text_dim, "text_proj_in_factor": layers + 1}
    for branch in ("video", "audio"):
        small |= {f"{branch}_connector_num_attention_heads": 2, f"{branch}_connector_attention_head_dim": 8}
        small |= {f"{branch}_connector_num_layers": 1}
    return {**config, **small}


def build_smoke_components(architecture: Path) -> dict[str, Any]:
    """The tiny components of the LTX-2 folder `architecture` (see the module docstring)."""
    import diffusers
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from framer_ds.tasks.video_lora.ltx2.tiny import (
        TEXT_DIM,
        TEXT_LAYERS,
        build_tiny_gemma_tokenizer,
        tiny_gemma3,
    )

    index = json.loads((architecture / "model_index.json").read_text())
    tokenizer = build_tiny_gemma_tokenizer()
    torch.manual_seed(0)
    # base_channels stays: the audio VAE's latent statistics have base_channels entries, one per packed
    # audio feature (latent channels x mel bins / 4)
    audio = {**read_config(architecture, "audio_vae"), "num_res_blocks": 1}
    vocoder = {**read_config(architecture, "vocoder"), "hidden_channels": 64}
    scheduler_class = getattr(diffusers, index["scheduler"][1])
    transformer = _transformer(read_config(architecture, "transformer"), TEXT_DIM)
    connectors = _connectors(read_config(architecture, "connectors"), TEXT_DIM, TEXT_LAYERS)
    return {
        "transformer": LTX2VideoTransformer3DModel.from_config(transformer),
        "vae": AutoencoderKLLTX2Video.from_config(_vae(read_config(architecture, "vae"))),
        "audio_vae": AutoencoderKLLTX2Audio.from_config(audio),
        "vocoder": LTX2Vocoder.from_config(vocoder),
        "connectors": LTX2TextConnectors.from_config(connectors),
        "text_encoder": tiny_gemma3(len(tokenizer)),
        "tokenizer": tokenizer,
        "scheduler": scheduler_class.from_config(
            read_config(architecture, "scheduler", "scheduler_config.json")
        ),
    }


def create_smoke_ltx2(path: Path, architecture: Path) -> Path:
    """Build (once, atomically) the tiny LTX-2 folder of `architecture` at `path`."""
    from diffusers import LTX2ImageToVideoPipeline

    def build(staging: Path) -> None:
        LTX2ImageToVideoPipeline(**build_smoke_components(architecture)).save_pretrained(staging)

    return build_once(path, MARKER, build, "tiny LTX-2 stand-in")
