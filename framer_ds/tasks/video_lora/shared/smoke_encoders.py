"""The CLIP image encoder of `framer-ds smoke`'s stand-in bases (SVD's and Framer's, Wan 2.1's), at the
tiny width every family's stand-in shares: in shared/ because svd/ and wan/ may not import each other."""

from __future__ import annotations

from typing import Any

EMBED = 32  # CLIP projection == SVD's UNet cross-attention width (1024 in SVD)


def tiny_clip_config(config: dict[str, Any]) -> dict[str, Any]:
    """CLIP vision tower: the image size and patch stay (the pipeline resizes to 224), width 16, 2 layers."""
    return {
        **config,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "projection_dim": EMBED,
    }
