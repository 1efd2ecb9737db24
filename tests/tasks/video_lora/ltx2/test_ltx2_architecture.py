"""The shipped LTX-2 architecture folder (framer_ds/config/architectures/Lightricks/LTX-2, from diffusers'
conversion script's "2.0" configs) builds on the meta device at the published sizes, and the family reads
LTX-2's own size and frame-count rules from it."""

from __future__ import annotations

import json

import torch

from conftest import REPO
from framer_ds.config.architectures import shipped_architecture


def test_the_shipped_ltx2_builds_at_its_published_sizes() -> None:
    """LTX-2 is published as a 19B audio-video transformer (Lightricks' model card: 14B video + 5B
    audio streams); counted on meta from the shipped config: 18.88e9 (the card rounds; 2% covers the
    rounding, not a missing block: one of 48 blocks is 2%). Its text encoder, Gemma 3 12B, counts
    12.19e9 the same way (not rebuilt here: ~15 s of transformers' init on 2 cores)."""
    from diffusers import LTX2VideoTransformer3DModel

    folder = shipped_architecture("Lightricks/LTX-2")
    with torch.device("meta"):
        transformer = LTX2VideoTransformer3DModel.from_config(
            json.loads((folder / "transformer" / "config.json").read_text())
        )
    count = sum(p.numel() for p in transformer.parameters())
    assert abs(count - 19e9) / 19e9 < 0.02, count
    audio = sum(p.numel() for name, p in transformer.named_parameters() if "audio" in name)
    assert 4.5e9 < audio < 6e9, audio  # the audio stream (+ its cross-attention), frozen by ltx2/lora.py


def test_the_family_reads_ltx2s_rules_from_the_shipped_folder(tmp_path) -> None:
    """32 px sides (the VAE's 32x, patch 1), 1 + 8k frames (its 8x in time), as LTX-2's pipelines need."""
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.families import family_for

    config = REPO / "configs" / "tasks" / "video_lora" / "ltx2_interp_512x768_97f.yaml"
    folder = shipped_architecture("Lightricks/LTX-2")
    family = family_for(load_run_config(config, [f"model.base.source.path={folder}"]))
    assert (family.size_multiple(), family.min_frames(), family.frame_grid()) == (32, 9, (1, 8))
    assert family.frame_count_problem(97) is None
    assert family.frame_count_problem(96) == "LTX-2's VAE needs 1 + a multiple of 8 frames, got 96: use 97"
