"""`framer-ds smoke`'s stand-in for a Framer release folder (`unet/` + `controlnet/`, as
wwen1997/framer_512x320): its UNet config (SVD-XT's UNet with a 9-channel conv_in) and its ControlNet
config at the SVD stand-in's tiny width and depth (svd/smoke_base.py), random, with Framer's
`mask_token`; the conditioning embedding keeps its number of stride-2 convs (heatmaps at pixel size ->
latent size) at 8-16 channels.
"""

from __future__ import annotations

from pathlib import Path

import torch

from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import read_config
from framer_ds.tasks.video_lora.framer.controlnet import ControlNetSVDModel
from framer_ds.tasks.video_lora.framer.model import add_mask_token
from framer_ds.tasks.video_lora.svd.smoke_base import tiny_unet_config

MARKER = ".framer_smoke_framer_complete"


def create_smoke_framer(path: Path, architecture: Path) -> Path:
    """Build (once, atomically) the tiny Framer folder of `architecture` at `path`."""

    def build(staging: Path) -> None:
        from diffusers import UNetSpatioTemporalConditionModel

        torch.manual_seed(0)
        unet = UNetSpatioTemporalConditionModel.from_config(
            tiny_unet_config(read_config(architecture, "unet"))
        )
        add_mask_token(unet)
        control = tiny_unet_config(read_config(architecture, "controlnet"))
        embedding = control["conditioning_embedding_out_channels"]
        control["conditioning_embedding_out_channels"] = [8] * (len(embedding) - 1) + [16]
        control["feature_channels"] = 16
        control["feature_out_channels"] = [16] * len(control["feature_out_channels"])
        controlnet = ControlNetSVDModel.from_config(control)
        with torch.no_grad():  # a trained release's output convs are not zero: the ControlNet acts
            zeroed = [controlnet.controlnet_cond_embedding.conv_out, controlnet.controlnet_mid_block]
            for conv in [*zeroed, *controlnet.controlnet_down_blocks]:
                conv.weight.normal_(0, 0.02)
        unet.save_pretrained(staging / "unet", safe_serialization=True)
        controlnet.save_pretrained(staging / "controlnet", safe_serialization=True)

    return build_once(path, MARKER, build, "tiny Framer stand-in")
