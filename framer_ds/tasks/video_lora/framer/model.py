"""Framer's UNet as diffusers' stock `UNetSpatioTemporalConditionModel` plus what Framer adds, and the one
trainable module of a Framer run (UNet, optional LoRA, ControlNet).

What Framer adds to SVD's UNet (aim-uofa/Framer `models_diffusers/unet_spatio_temporal_condition.py`):
- `in_channels` 9: noisy latents, conditioning latents, and a mask channel;
- a learned `mask_token` parameter of shape [1, 1, 4, 1, 1] at the UNet's root (the conditioning
  latent of every missing frame; the pipeline reads `unet.mask_token`);
- ControlNet residuals: `forward(..., down_block_additional_residuals, mid_block_additional_residual)`
  adds the i-th down residual to the i-th skip connection AFTER all down blocks ran (the path through
  the down blocks is unchanged) and the mid residual to the mid block's output.

Everything else has the stock names: Framer's `from_pretrained` loads the SVD-xt diffusers checkpoint
and raises on any missing key, adding only `mask_token` and widening `conv_in`. So a stock UNet with a
`mask_token` parameter registered at its root has exactly Framer's state-dict keys (and module names,
which peft adapters are keyed by), and the residuals go in through hooks instead of a forked forward:
a forward pre-hook on each up block adds the residuals of the skip connections it consumes, a forward
hook on the mid block adds the mid residual (`ControlNetResiduals`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from framer_ds.tasks.video_lora.framer.controlnet import ControlNetSVDModel

MASK_TOKEN = "mask_token"
FRAMER_IN_CHANNELS = 9
WEIGHT_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


def add_mask_token(unet: nn.Module, value: Tensor | None = None) -> nn.Module:
    """Register Framer's `mask_token` [1,1,C,1,1] (C = latent channels) at the UNet's root; random
    normal like Framer's init unless `value` is given. Returns the UNet."""
    shape = (1, 1, unet.config.out_channels, 1, 1)
    param = next(unet.parameters())
    data = torch.randn(shape, dtype=param.dtype) if value is None else value.reshape(shape)
    unet.register_parameter(MASK_TOKEN, nn.Parameter(data.to(param.device, param.dtype)))
    return unet


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in shards]
    for name in WEIGHT_NAMES:
        if (folder / name).is_file():
            return [folder / name]
    raise FileNotFoundError(
        f"{folder} holds no diffusers weights ({' or '.join(WEIGHT_NAMES)}); point model.base.source.path "
        "at a Framer directory with unet/ and controlnet/ (e.g. the framer_512x320 release)"
    )


def read_state_dict(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a diffusers model folder (single file, sharded safetensors, or .bin)."""
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for path in _weight_files(Path(folder)):
        if path.suffix == ".safetensors":
            state.update(load_file(str(path)))
        else:
            state.update(torch.load(path, map_location="cpu", weights_only=True))
    return state


def load_strict(model: nn.Module, folder: Path, what: str) -> nn.Module:
    """Load a folder's weights into a model built on the meta device; any missing or unexpected key is an
    error naming them (a Framer checkpoint must match exactly, as Framer's own loader demands). Floating
    weights arrive in float32 whatever the file holds (releases are often fp16), as diffusers'
    `from_pretrained` gives them for the SVD base: trainable weights need fp32 masters (DDP's fp16
    GradScaler refuses fp16 parameters); DeepSpeed casts the whole module to its precision, and DDP's
    autocast computes in the mixed precision from these weights."""
    state = {k: v.float() if v.is_floating_point() else v for k, v in read_state_dict(folder).items()}
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{folder} is not a Framer {what} checkpoint: missing keys {missing[:5]} ({len(missing)}), "
            f"unexpected keys {unexpected[:5]} ({len(unexpected)}). Use the unet/ and controlnet/ folders "
            "of a Framer release (framer_512x320) or of `framer-ds export --format framer`."
        )
    model.load_state_dict(state, strict=True, assign=True)
    return model


def load_framer_unet(folder: Path, *, empty: bool = False) -> nn.Module:
    """Framer's `unet/` into a stock diffusers UNet + `mask_token`, strictly (no missing or unexpected
    key). `empty`: on the meta device, reading only config.json (`framer-ds plan`)."""
    from diffusers import UNetSpatioTemporalConditionModel

    folder = Path(folder)
    config = UNetSpatioTemporalConditionModel.load_config(folder)
    if config.get("in_channels") != FRAMER_IN_CHANNELS:
        raise ValueError(
            f"{folder}/config.json says in_channels {config.get('in_channels')}; a Framer UNet has "
            f"{FRAMER_IN_CHANNELS} (noisy + conditioning latents + mask)"
        )
    with torch.device("meta"):
        unet = add_mask_token(UNetSpatioTemporalConditionModel.from_config(config))
    return unet if empty else load_strict(unet, folder, "UNet")


def load_framer_controlnet(folder: Path, *, empty: bool = False) -> ControlNetSVDModel:
    """Framer's `controlnet/` into our ControlNetSVDModel, strictly."""
    folder = Path(folder)
    config = ControlNetSVDModel.load_config(folder)
    with torch.device("meta"):
        controlnet = ControlNetSVDModel.from_config(config)
    return controlnet if empty else load_strict(controlnet, folder, "ControlNet")


class ControlNetResiduals:
    """Hooks that add ControlNet residuals inside a stock UNet's forward, exactly where Framer's forked
    forward adds them. `set(down, mid)` before the UNet call, `clear()` after; with nothing set the
    hooks do nothing, so the UNet computes what it computes without them."""

    def __init__(self, unet: nn.Module):
        self.down: list[Tensor] | None = None
        self.mid: Tensor | None = None
        self._handles = [unet.mid_block.register_forward_hook(self._add_mid)]
        # Up blocks consume the skip connections from the end: block 0 the last len(resnets), ...
        total = 1 + sum(len(b.resnets) + (1 if b.downsamplers else 0) for b in unet.down_blocks)
        end = total
        for block in unet.up_blocks:
            start = end - len(block.resnets)
            hook = self._make_up_hook(start, end)
            self._handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
            end = start
        if end != 0:
            raise ValueError(f"UNet up blocks consume {total - end} of {total} skip connections")
        self.count = total

    def set(self, down: list[Tensor], mid: Tensor) -> None:
        if len(down) != self.count:
            raise ValueError(
                f"the ControlNet gave {len(down)} down residuals, the UNet has {self.count} skips"
            )
        self.down, self.mid = list(down), mid

    def clear(self) -> None:
        self.down = self.mid = None

    def _add_mid(self, module, args, output):
        return output if self.mid is None else output + self.mid.to(output.dtype)

    def _make_up_hook(self, start: int, end: int):
        def add_skips(module, args, kwargs):
            if self.down is None:
                return None
            skips = kwargs["res_hidden_states_tuple"]
            added = tuple(s + r.to(s.dtype) for s, r in zip(skips, self.down[start:end], strict=True))
            return args, {**kwargs, "res_hidden_states_tuple": added}

        return add_skips

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class FramerModel(nn.Module):
    """The module a Framer run trains: `unet` (Framer's UNet, possibly a peft model around it) and
    `controlnet` (None when the run has none). Called like the UNet, plus `controlnet_cond` (per-frame
    heatmaps [B,F,3,H,W]) and `conditioning_scale`; without `controlnet_cond` (or at scale 0) the
    ControlNet is skipped, which is what Framer's pipeline does without points (`with_control=False`).

    `mask_token` is read by the conditioning outside the UNet's forward, where ZeRO-3 has it
    partitioned: a non-persistent buffer keeps a copy of the base's token. With `train_mask_token`
    the model also owns a trainable `mask_token` parameter (at its root, so ZeRO-3 gathers it in this
    module's forward and the checkpoint and the gathered export hold it): `forward` writes it over
    the conditioning latents of every missing frame (mask channel 1), which is what
    `framer_conditioning` put there with the buffer's value, so the gradient reaches the token."""

    def __init__(
        self,
        unet: nn.Module,
        controlnet: ControlNetSVDModel | None,
        mask_token: Tensor,
        train_mask_token: bool = False,
    ):
        super().__init__()
        self.unet = unet
        self.controlnet = controlnet
        self.register_buffer("mask_token_value", mask_token.detach().clone(), persistent=False)
        self.mask_token = nn.Parameter(mask_token.detach().clone()) if train_mask_token else None
        self.residuals = ControlNetResiduals(base_unet(unet))

    def with_trained_token(self, sample: Tensor) -> Tensor:
        """The UNet input [B,F,2C+1,h,w] (noisy, conditioning latents, Framer's mask channel) with the
        trainable token on the missing frames. The mask is exactly 0 or 1, so `mask * token + (1 -
        mask) * latents` replaces those latents and keeps the given frames bit for bit."""
        if self.mask_token is None:
            return sample
        c = self.mask_token.shape[2]
        noisy, latents, mask = sample[:, :, :c], sample[:, :, c : 2 * c], sample[:, :, 2 * c :]
        token = self.mask_token.to(sample.dtype)
        return torch.cat([noisy, mask * token + (1 - mask) * latents, mask], dim=2)

    @property
    def config(self):
        return base_unet(self.unet).config

    def forward(
        self,
        sample: Tensor,
        timestep: Tensor | float,
        encoder_hidden_states: Tensor,
        added_time_ids: Tensor,
        controlnet_cond: Tensor | None = None,
        conditioning_scale: float = 1.0,
        return_dict: bool = False,
    ):
        sample = self.with_trained_token(sample)
        use_control = self.controlnet is not None and controlnet_cond is not None and conditioning_scale != 0
        if use_control:
            down, mid = self.controlnet(
                sample,
                timestep,
                encoder_hidden_states=encoder_hidden_states,
                added_time_ids=added_time_ids,
                controlnet_cond=controlnet_cond,
                conditioning_scale=conditioning_scale,
            )
            self.residuals.set(down, mid)
        try:
            return self.unet(
                sample,
                timestep,
                encoder_hidden_states=encoder_hidden_states,
                added_time_ids=added_time_ids,
                return_dict=return_dict,
            )
        finally:
            self.residuals.clear()


def base_unet(unet: nn.Module) -> nn.Module:
    """The diffusers UNet inside a peft model (or the UNet itself)."""
    get_base = getattr(unet, "get_base_model", None)
    return get_base() if get_base is not None else unet
