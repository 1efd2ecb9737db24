"""The registry of video_lora's base families: `model.base.name` -> the family serving it (shared/
protocol.py says what a family supplies). SVD (svd/, EDM on a UNet), Framer (framer/, SVD's family
extended), Wan (wan/) and LTX-2 (ltx2/), rectified flow on a DiT. A new base is its folder, one case
here and one member of config.py's `VideoBase` union (with its sample flags).

Each family is imported on use, here, downward (the layers contract in pyproject.toml sees it): each pulls
in its own models, and reading a config (`framer-ds validate`) imports none of them."""

from __future__ import annotations

from typing import Any

from framer_ds.tasks.video_lora.shared.protocol import VideoBaseFamily


def family_for(config: Any) -> VideoBaseFamily:
    """The family serving `config.model.base.name` (the config's union admits no other name)."""
    match config.model.base.name:
        case "wan":
            from framer_ds.tasks.video_lora.wan.family import WanFamily as family
        case "ltx2":
            from framer_ds.tasks.video_lora.ltx2.family import Ltx2Family as family
        case "framer":
            from framer_ds.tasks.video_lora.framer.family import FramerFamily as family
        case _:
            from framer_ds.tasks.video_lora.svd.family import SvdFamily as family
    return family(config)
