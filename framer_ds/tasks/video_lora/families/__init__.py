"""The base families of the video_lora task, one per `model.base.name` (protocol.py says what each
supplies): SVD (svd.py, EDM on a UNet), Framer (framer_setup.py, SVD's family extended) and Wan (wan.py,
rectified flow on a DiT)."""

from __future__ import annotations

from typing import Any

from framer_ds.tasks.video_lora.families.protocol import VideoBaseFamily


def family_for(config: Any) -> VideoBaseFamily:
    """The family serving `config.model.base.name` (imported here: each pulls in its own models)."""
    name = config.model.base.name
    if name == "wan":
        from framer_ds.tasks.video_lora.families.wan import WanFamily

        return WanFamily(config)
    if name == "framer":
        from framer_ds.tasks.video_lora.framer_setup import FramerFamily

        return FramerFamily(config)
    from framer_ds.tasks.video_lora.families.svd import SvdFamily

    return SvdFamily(config)
