"""A tiny random Framer checkpoint in Framer's release layout: `unet/` (SVD's UNet with a 9-channel
`conv_in` and a `mask_token`) and `controlnet/` (ControlNet-SVD), each `config.json` +
`diffusion_pytorch_model.safetensors`, like `framer_512x320`. Built once from the tiny SVD UNet
(`svd/tiny.py`), so the VAE and CLIP encoder of that tiny SVD fit it, as SVD-xt's fit the release.

Unlike a fresh ControlNet, the output convs are small random values, as in a trained release, so the
ControlNet changes the UNet's output and every ControlNet parameter receives gradients.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import UNetSpatioTemporalConditionModel

from framer_ds.storage.atomic import build_once
from framer_ds.tasks.video_lora.framer.controlnet import ControlNetSVDModel
from framer_ds.tasks.video_lora.framer.model import add_mask_token

MARKER = ".framer_tiny_framer_complete"
TINY_CONDITIONING_CHANNELS = (8, 8, 8, 16)  # 3 stride-2 convs: heatmaps at pixel size -> latent size


def build_tiny_framer(svd_dir: Path, seed: int = 0) -> tuple[torch.nn.Module, ControlNetSVDModel]:
    """(Framer UNet, ControlNet) from the tiny SVD at `svd_dir`: conv_in widened to 9 channels with
    random mask weights, a random mask_token, and a ControlNet copied from that UNet."""
    torch.manual_seed(seed)
    svd_unet = UNetSpatioTemporalConditionModel.from_pretrained(svd_dir, subfolder="unet")
    config = {**dict(svd_unet.config), "in_channels": 9}
    unet = UNetSpatioTemporalConditionModel.from_config(config)
    state = svd_unet.state_dict()
    conv_in = torch.randn_like(unet.conv_in.weight) * 0.02
    conv_in[:, :8] = state["conv_in.weight"]
    unet.load_state_dict({**state, "conv_in.weight": conv_in})
    add_mask_token(unet)
    controlnet = ControlNetSVDModel.from_unet(
        unet, conditioning_embedding_out_channels=TINY_CONDITIONING_CHANNELS
    )
    with torch.no_grad():
        zeroed = [controlnet.controlnet_cond_embedding.conv_out, controlnet.controlnet_mid_block]
        for conv in [*zeroed, *controlnet.controlnet_down_blocks]:
            conv.weight.normal_(0, 0.02)
    return unet, controlnet


def create_tiny_framer(path: Path, svd_dir: Path, seed: int = 0) -> Path:
    """Build (once, atomically, like `create_tiny_svd`) a tiny Framer directory at `path`."""

    def build(staging: Path) -> None:
        unet, controlnet = build_tiny_framer(svd_dir, seed)
        unet.save_pretrained(staging / "unet", safe_serialization=True)
        controlnet.save_pretrained(staging / "controlnet", safe_serialization=True)

    return build_once(path, MARKER, build, "tiny Framer checkpoint")
