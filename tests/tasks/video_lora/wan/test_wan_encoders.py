"""Wan's frozen encoders load each component as the folder's model_index.json names it."""

from __future__ import annotations

from pathlib import Path

from framer_ds.config.architectures import shipped_architecture
from framer_ds.tasks.video_lora.wan.encoders import FrozenWanEncoders
from framer_ds.tasks.video_lora.wan.smoke_base import create_smoke_wan


def test_a_hub_layout_clip_tower_loads_without_a_load_report(tmp_path: Path, capfd) -> None:
    """Wan-AI's folders save the CLIP tower as CLIPVisionModelWithProjection. Read as CLIPVisionModel
    (before), transformers printed a LOAD REPORT table of the unused `visual_projection` on every rank of
    every run and sample; loaded as the class the folder names, the console stays framer_ds's own."""
    architecture = shipped_architecture("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers")
    assert architecture is not None
    folder = create_smoke_wan(tmp_path / "wan", architecture)  # the hub's layout at a tiny width
    capfd.readouterr()
    loaded = FrozenWanEncoders(folder).load(text=False)  # (vae, image encoder): no UMT5 without text
    console = "".join(capfd.readouterr())
    assert [type(m).__name__ for m in loaded] == ["AutoencoderKLWan", "CLIPVisionModelWithProjection"]
    assert "LOAD REPORT" not in console and "visual_projection" not in console, console[-2000:]
