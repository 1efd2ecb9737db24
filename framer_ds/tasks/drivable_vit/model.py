"""The drivable-space ViT: a spatial ViT shared across views, a cross-view transformer over all views'
tokens of a frame, a temporal transformer over frames (per token), and a light upsampling decoder that
turns patch tokens into per-pixel logits at input resolution.

Plain PyTorch with attention through `scaled_dot_product_attention`. Why the details:
- Every configured block count is built (the original built one cross-view and one temporal block
  whatever its config said); `block_counts` reports them and a test counts them.
- ZeRO-3 partitions parameters and gathers them in each module's forward hooks: every parameter is used
  only inside the forward of the module that owns it, never read by shape outside one (a partitioned
  parameter has shape (0,)), and each is initialised where it is created (no `apply` afterwards, which
  would touch empty shards under `zero.Init`).
- No autocast: under DeepSpeed the module is cast to fp16/bf16 and the loop casts the inputs.
- Activation checkpointing per block (non-reentrant, so ZeRO-3's hooks gather again on recompute).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from framer_ds.tasks.drivable_vit.config import DrivableModelConfig
from framer_ds.tasks.drivable_vit.multiview_manifest import EGO_MOTION_DIM


def _embedding(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * 0.02)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, causal: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class BlockStack(nn.Module):
    def __init__(self, depth: int, dim: int, heads: int, mlp_ratio: float, causal: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, causal) for _ in range(depth))
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class SpatialEncoder(nn.Module):
    """Images [M, 3, H, W] -> tokens [M, 1 + N, D] (CLS first); one ViT for every view and frame."""

    def __init__(self, config: DrivableModelConfig, masked_tokens: bool):
        super().__init__()
        dim, patches = config.embed_dim, (config.image_size // config.patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, config.patch_size, stride=config.patch_size)
        self.cls_token = _embedding(1, 1, dim)
        self.pos_embed = _embedding(1, 1 + patches, dim)
        self.mask_token = _embedding(1, 1, dim) if masked_tokens else None
        self.stack = BlockStack(config.spatial_layers, dim, config.num_heads, config.mlp_ratio)

    def forward(self, images: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens = self.patch_embed(images).flatten(2).transpose(1, 2)  # [M, N, D]
        if token_mask is not None and self.mask_token is not None:
            tokens = torch.where(token_mask.unsqueeze(-1), self.mask_token.to(tokens.dtype), tokens)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return self.stack(torch.cat([cls, tokens], dim=1) + self.pos_embed)


class CrossViewEncoder(nn.Module):
    """[B*T, V, L, D] -> same: attention over the tokens of every view of a frame, with a view embedding."""

    def __init__(self, config: DrivableModelConfig, views: int):
        super().__init__()
        self.view_embed = _embedding(1, views, 1, config.embed_dim)
        self.stack = BlockStack(
            config.cross_view_layers, config.embed_dim, config.num_heads, config.mlp_ratio
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames, views, length, dim = x.shape
        x = (x + self.view_embed).reshape(frames, views * length, dim)
        return self.stack(x).view(frames, views, length, dim)


class TemporalEncoder(nn.Module):
    """[B, T, V, L, D] -> same: attention over frames for each view's token, with a time embedding and
    optional ego-motion conditioning ([B, T, 9], normalised by the data)."""

    def __init__(self, config: DrivableModelConfig, frames: int):
        super().__init__()
        dim = config.embed_dim
        self.time_embed = _embedding(1, frames, 1, 1, dim)
        self.ego = (
            nn.Sequential(nn.Linear(EGO_MOTION_DIM, dim), nn.GELU(), nn.Linear(dim, dim))
            if config.ego_motion
            else None
        )
        self.stack = BlockStack(
            config.temporal_layers, dim, config.num_heads, config.mlp_ratio, causal=config.temporal_causal
        )

    def forward(self, x: torch.Tensor, ego_motion: torch.Tensor | None) -> torch.Tensor:
        batch, frames, views, length, dim = x.shape
        x = x + self.time_embed
        if self.ego is not None:
            if ego_motion is None:
                raise ValueError("the model was built with model.ego_motion: pass ego_motion [B, T, 9]")
            x = x + self.ego(ego_motion.to(x.dtype))[:, :, None, None, :]
        x = x.permute(0, 2, 3, 1, 4).reshape(batch * views * length, frames, dim)
        x = self.stack(x)
        return x.view(batch, views, length, frames, dim).permute(0, 3, 1, 2, 4)


class SegmentationDecoder(nn.Module):
    """Patch tokens [M, N, D] -> logits [M, H, W]: 1x1 projection, x2 upsampling conv stages, a 1x1
    head, then bilinear interpolation to the input size."""

    def __init__(self, config: DrivableModelConfig):
        super().__init__()
        self.grid, self.size = config.image_size // config.patch_size, config.image_size
        self.norm = nn.LayerNorm(config.embed_dim)
        channels = config.decoder_channels
        self.project = nn.Conv2d(config.embed_dim, channels[0], 1)
        self.stages = nn.ModuleList(
            nn.Conv2d(channels[max(i - 1, 0)], channels[i], 3, padding=1) for i in range(len(channels))
        )
        self.head = nn.Conv2d(channels[-1], 1, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        count, _, dim = tokens.shape
        x = self.norm(tokens).transpose(1, 2).reshape(count, dim, self.grid, self.grid)
        x = self.project(x)
        for conv in self.stages:
            x = F.gelu(conv(F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)))
        logits = self.head(x)
        if logits.shape[-1] != self.size:
            logits = F.interpolate(logits, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return logits[:, 0]


class DrivableViT(nn.Module):
    """`forward(pixel_values [B, T, V, 3, H, W], ego_motion [B, T, 9] | None)` -> dict with `logits`
    [B, F, V, H, W] (F = 1 for the last frame, or T) and, with `with_aux`, what the auxiliary losses need."""

    def __init__(self, config: DrivableModelConfig, views: int, frames: int):
        super().__init__()
        self.settings, self.views, self.frames = config, views, frames
        aux, dim = config.aux, config.embed_dim
        self.spatial = SpatialEncoder(config, masked_tokens=aux.masked_patch_weight > 0)
        self.cross_view = CrossViewEncoder(config, views) if config.cross_view_layers else None
        self.temporal = TemporalEncoder(config, frames) if config.temporal_layers else None
        self.decoder = SegmentationDecoder(config)
        patch_pixels = 3 * config.patch_size**2
        self.reconstruct = nn.Linear(dim, patch_pixels) if aux.masked_patch_weight > 0 else None
        self.next_frame = nn.Linear(dim, dim) if aux.next_frame_weight > 0 else None
        self.consistency = nn.Linear(dim, dim) if aux.cross_view_weight > 0 else None

    def block_counts(self) -> dict[str, int]:
        """Blocks actually built per stage (what the config asked for, checked by the tests)."""
        return {
            "spatial": len(self.spatial.stack.blocks),
            "cross_view": len(self.cross_view.stack.blocks) if self.cross_view else 0,
            "temporal": len(self.temporal.stack.blocks) if self.temporal else 0,
        }

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        for module in self.modules():
            if isinstance(module, BlockStack):
                module.gradient_checkpointing = enabled

    def random_token_mask(self, count: int, device: torch.device) -> torch.Tensor:
        """[count, N] booleans, each patch masked with probability aux.mask_ratio (shape-static, so the
        planner's fake tensors follow it)."""
        patches = (self.settings.image_size // self.settings.patch_size) ** 2
        return torch.rand(count, patches, device=device) < self.settings.aux.mask_ratio

    def forward(
        self,
        pixel_values: torch.Tensor,
        ego_motion: torch.Tensor | None = None,
        with_aux: bool = False,
    ) -> dict[str, torch.Tensor]:
        batch, frames, views = pixel_values.shape[:3]
        images = pixel_values.flatten(0, 2)  # [B*T*V, 3, H, W]
        out: dict[str, torch.Tensor] = {}
        token_mask = None
        if with_aux and self.reconstruct is not None:
            token_mask = self.random_token_mask(images.shape[0], images.device)
        tokens = self.spatial(images, token_mask)  # [B*T*V, L, D]
        length, dim = tokens.shape[1:]
        if token_mask is not None:
            out["reconstruction"], out["token_mask"] = self.reconstruct(tokens[:, 1:]), token_mask
        tokens = tokens.view(batch * frames, views, length, dim)
        if self.cross_view is not None:
            tokens = self.cross_view(tokens)
        tokens = tokens.view(batch, frames, views, length, dim)
        if with_aux and self.consistency is not None:
            out["view_embeddings"] = self.consistency(tokens[:, :, :, 0])  # [B, T, V, D]
        frame_features = tokens[:, :, :, 0]
        if self.temporal is not None:
            tokens = self.temporal(tokens, ego_motion)
        if with_aux and self.next_frame is not None:
            out["next_frame_prediction"] = self.next_frame(tokens[:, :-1, :, 0])
            out["next_frame_target"] = frame_features[:, 1:].detach()
        if self.settings.segment_frames == "last":
            tokens = tokens[:, -1:]
        kept = tokens.shape[1]
        logits = self.decoder(tokens[:, :, :, 1:].reshape(batch * kept * views, length - 1, dim))
        out["logits"] = logits.view(batch, kept, views, *logits.shape[-2:])
        return out


def patchify(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, T, V, 3, H, W] -> [B*T*V, N, 3*patch*patch], in the patch embedding's token order."""
    images = pixel_values.flatten(0, 2)
    patches = F.unfold(images, kernel_size=patch, stride=patch)  # [M, 3*p*p, N]
    return patches.transpose(1, 2)


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
