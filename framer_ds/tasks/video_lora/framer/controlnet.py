"""ControlNet-SVD: the trajectory branch of Framer, whose state dict loads Framer's `controlnet/` checkpoint.

Our own implementation of the architecture Framer released (aim-uofa/Framer
`models_diffusers/controlnet_svd.py`, class `ControlNetSVDModel`; ComfyUI-FramerWrapper's
`configs/controlnet_config.json` is the same config). Parameter names and shapes equal theirs, so
`ControlNetSVDModel.from_pretrained(FRAMER/controlnet)` loads the release with no missing or
unexpected keys and our exports load in their class:

- the encoder half of SVD's UNet (`conv_in` with the UNet's 9 input channels, `time_embedding`,
  `add_embedding`, `down_blocks`, `mid_block`), built from diffusers' stock blocks;
- `controlnet_cond_embedding` (`conv_in`, `blocks.*`, a zero-initialised `conv_out`): per-frame
  conditioning images (Gaussian point heatmaps, 3 channels, pixel resolution) down to latent
  resolution, ADDED to the `conv_in` output of the noisy input;
- one zero-initialised 1x1 conv per skip connection (`controlnet_down_blocks.*`: the `conv_in` output,
  every resnet of every down block, every downsampler) and one for the mid block
  (`controlnet_mid_block`).

The forward returns (down residuals, mid residual), each times `conditioning_scale`, which Framer's
UNet adds to its skip connections and mid-block output (`framer_model.ControlNetResiduals`). Zero
output convs make a fresh ControlNet (`from_unet`) change nothing until it is trained.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.unets.unet_3d_blocks import UNetMidBlockSpatioTemporal, get_down_block
from torch import Tensor, nn


def _zeroed(module: nn.Module) -> nn.Module:
    for param in module.parameters():
        nn.init.zeros_(param)
    return module


class ControlNetConditioningEmbeddingSVD(nn.Module):
    """Conditioning frames [B,F,C,H,W] -> features [B*F, channels, H/8, W/8] (3 stride-2 convs for the
    default 4 entries of `block_out_channels`). Framer's names: `conv_in`, `blocks.{i}`, `conv_out`."""

    def __init__(
        self,
        conditioning_embedding_channels: int,
        conditioning_channels: int = 3,
        block_out_channels: tuple[int, ...] = (16, 32, 96, 256),
    ):
        super().__init__()
        self.conv_in = nn.Conv2d(conditioning_channels, block_out_channels[0], kernel_size=3, padding=1)
        self.blocks = nn.ModuleList()
        for channel_in, channel_out in pairwise(block_out_channels):
            self.blocks.append(nn.Conv2d(channel_in, channel_in, kernel_size=3, padding=1))
            self.blocks.append(nn.Conv2d(channel_in, channel_out, kernel_size=3, padding=1, stride=2))
        self.conv_out = _zeroed(
            nn.Conv2d(block_out_channels[-1], conditioning_embedding_channels, kernel_size=3, padding=1)
        )

    def forward(self, conditioning: Tensor) -> Tensor:
        x = F.silu(self.conv_in(conditioning.flatten(0, 1)))
        for block in self.blocks:
            x = F.silu(block(x))
        return self.conv_out(x)


def _per_block(value, count: int) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * count


def _skip_conv(channels: int) -> nn.Module:
    """A zero-initialised 1x1 conv on one skip connection: a fresh ControlNet adds nothing."""
    return _zeroed(nn.Conv2d(channels, channels, kernel_size=1))


def _encoder_down_blocks(
    down_block_types: tuple[str, ...],
    block_out_channels: tuple[int, ...],
    layers: tuple,
    transformer_layers: tuple,
    cross: tuple,
    heads: tuple,
    time_embed_dim: int,
) -> tuple[nn.ModuleList, nn.ModuleList]:
    """(down_blocks, controlnet_down_blocks): diffusers' down blocks of SVD's encoder half and the skip
    conv of every skip connection they feed (the `conv_in` output, each resnet, each downsampler), built
    in diffusers' ControlNet order (each down block, then its skip convs), which fixes the random draws
    of a seeded construction."""
    down_blocks = nn.ModuleList()
    skip_convs = nn.ModuleList([_skip_conv(block_out_channels[0])])
    output_channel = block_out_channels[0]
    for i, block_type in enumerate(down_block_types):
        input_channel, output_channel = output_channel, block_out_channels[i]
        is_final = i == len(down_block_types) - 1
        down_blocks.append(
            get_down_block(
                block_type,
                num_layers=layers[i],
                transformer_layers_per_block=transformer_layers[i],
                in_channels=input_channel,
                out_channels=output_channel,
                temb_channels=time_embed_dim,
                add_downsample=not is_final,
                resnet_eps=1e-5,
                cross_attention_dim=cross[i],
                num_attention_heads=heads[i],
                resnet_act_fn="silu",
            )
        )
        for _ in range(layers[i] + (0 if is_final else 1)):
            skip_convs.append(_skip_conv(output_channel))
    return down_blocks, skip_convs


class ControlNetSVDModel(ModelMixin, ConfigMixin):
    """Framer's ControlNet-SVD (config keys and parameter names as theirs; `with_id_feature` and the
    `feature_*` keys are accepted for config compatibility, Framer's release sets no id features)."""

    _supports_gradient_checkpointing = True

    @register_to_config
    def __init__(
        self,
        sample_size: int | None = None,
        in_channels: int = 9,
        out_channels: int = 4,
        down_block_types: tuple[str, ...] = (
            "CrossAttnDownBlockSpatioTemporal",
            "CrossAttnDownBlockSpatioTemporal",
            "CrossAttnDownBlockSpatioTemporal",
            "DownBlockSpatioTemporal",
        ),
        up_block_types: tuple[str, ...] = (
            "UpBlockSpatioTemporal",
            "CrossAttnUpBlockSpatioTemporal",
            "CrossAttnUpBlockSpatioTemporal",
            "CrossAttnUpBlockSpatioTemporal",
        ),
        block_out_channels: tuple[int, ...] = (320, 640, 1280, 1280),
        addition_time_embed_dim: int = 256,
        projection_class_embeddings_input_dim: int = 768,
        layers_per_block: int | tuple[int, ...] = 2,
        cross_attention_dim: int | tuple[int, ...] = 1024,
        transformer_layers_per_block: int | tuple[int, ...] = 1,
        num_attention_heads: int | tuple[int, ...] = (5, 10, 20, 20),
        num_frames: int = 25,
        conditioning_channels: int = 3,
        conditioning_embedding_out_channels: tuple[int, ...] = (16, 32, 96, 256),
        with_id_feature: bool = False,
        feature_channels: int = 160,
        feature_out_channels: tuple[int, ...] = (160, 160, 256, 256),
    ):
        super().__init__()
        if with_id_feature:
            raise ValueError(
                "with_id_feature=True (Framer's unreleased point-feature adapter) is not supported; "
                "Framer's released controlnet/config.json sets it to false"
            )
        if len(block_out_channels) != len(down_block_types):
            raise ValueError("block_out_channels and down_block_types must have the same length")
        count = len(down_block_types)
        heads = _per_block(num_attention_heads, count)
        cross = _per_block(cross_attention_dim, count)
        layers = _per_block(layers_per_block, count)
        transformer_layers = _per_block(transformer_layers_per_block, count)

        self.conv_in = nn.Conv2d(in_channels, block_out_channels[0], kernel_size=3, padding=1)
        time_embed_dim = block_out_channels[0] * 4
        self.time_proj = Timesteps(block_out_channels[0], True, downscale_freq_shift=0)
        self.time_embedding = TimestepEmbedding(block_out_channels[0], time_embed_dim)
        self.add_time_proj = Timesteps(addition_time_embed_dim, True, downscale_freq_shift=0)
        self.add_embedding = TimestepEmbedding(projection_class_embeddings_input_dim, time_embed_dim)
        self.controlnet_cond_embedding = ControlNetConditioningEmbeddingSVD(
            block_out_channels[0], conditioning_channels, tuple(conditioning_embedding_out_channels)
        )

        self.down_blocks, self.controlnet_down_blocks = _encoder_down_blocks(
            tuple(down_block_types),
            tuple(block_out_channels),
            layers,
            transformer_layers,
            cross,
            heads,
            time_embed_dim,
        )
        self.controlnet_mid_block = _skip_conv(block_out_channels[-1])
        self.mid_block = UNetMidBlockSpatioTemporal(
            block_out_channels[-1],
            temb_channels=time_embed_dim,
            transformer_layers_per_block=transformer_layers[-1],
            cross_attention_dim=cross[-1],
            num_attention_heads=heads[-1],
        )

    @classmethod
    def from_unet(
        cls,
        unet: nn.Module,
        conditioning_channels: int = 3,
        conditioning_embedding_out_channels: tuple[int, ...] = (16, 32, 96, 256),
    ) -> ControlNetSVDModel:
        """A fresh ControlNet whose encoder copies `unet`'s (as Framer's `from_unet`): with its zero
        output convs it changes nothing until trained."""
        config = unet.config
        controlnet = cls(
            sample_size=config.sample_size,
            in_channels=config.in_channels,
            out_channels=config.out_channels,
            down_block_types=tuple(config.down_block_types),
            up_block_types=tuple(config.up_block_types),
            block_out_channels=tuple(config.block_out_channels),
            addition_time_embed_dim=config.addition_time_embed_dim,
            projection_class_embeddings_input_dim=config.projection_class_embeddings_input_dim,
            layers_per_block=config.layers_per_block,
            cross_attention_dim=config.cross_attention_dim,
            transformer_layers_per_block=config.transformer_layers_per_block,
            num_attention_heads=config.num_attention_heads,
            num_frames=config.num_frames,
            conditioning_channels=conditioning_channels,
            conditioning_embedding_out_channels=tuple(conditioning_embedding_out_channels),
        )
        for name in ("conv_in", "time_embedding", "add_embedding", "down_blocks", "mid_block"):
            getattr(controlnet, name).load_state_dict(getattr(unet, name).state_dict())
        return controlnet if controlnet.dtype == unet.dtype else controlnet.to(dtype=unet.dtype)

    def forward(
        self,
        sample: Tensor,
        timestep: Tensor | float,
        encoder_hidden_states: Tensor,
        added_time_ids: Tensor,
        controlnet_cond: Tensor,
        conditioning_scale: float = 1.0,
        return_dict: bool = False,
    ) -> tuple[list[Tensor], Tensor]:
        """sample [B,F,9,h,w] (the UNet's own input), controlnet_cond [B,F,3,H,W] with H = 8h.
        Returns (down residuals, one per UNet skip connection, [B*F,C,h',w'] each; mid residual)."""
        batch, frames = sample.shape[:2]
        timesteps = torch.as_tensor(timestep, device=sample.device)
        timesteps = timesteps.reshape(-1).expand(batch)
        emb = self.time_embedding(self.time_proj(timesteps).to(dtype=sample.dtype))
        time_embeds = self.add_time_proj(added_time_ids.flatten()).reshape(batch, -1)
        emb = emb + self.add_embedding(time_embeds.to(emb.dtype))
        emb = emb.repeat_interleave(frames, dim=0)
        encoder_hidden_states = encoder_hidden_states.repeat_interleave(frames, dim=0)
        indicator = torch.zeros(batch, frames, dtype=sample.dtype, device=sample.device)

        hidden = self.conv_in(sample.flatten(0, 1))
        hidden = hidden + self.controlnet_cond_embedding(controlnet_cond.to(hidden.dtype))
        skips: tuple[Tensor, ...] = (hidden,)
        for block in self.down_blocks:
            kwargs = {"hidden_states": hidden, "temb": emb, "image_only_indicator": indicator}
            if getattr(block, "has_cross_attention", False):
                kwargs["encoder_hidden_states"] = encoder_hidden_states
            hidden, block_skips = block(**kwargs)
            skips += block_skips
        hidden = self.mid_block(
            hidden_states=hidden,
            temb=emb,
            encoder_hidden_states=encoder_hidden_states,
            image_only_indicator=indicator,
        )
        down = [
            conv(skip) * conditioning_scale
            for skip, conv in zip(skips, self.controlnet_down_blocks, strict=True)
        ]
        return down, self.controlnet_mid_block(hidden) * conditioning_scale
