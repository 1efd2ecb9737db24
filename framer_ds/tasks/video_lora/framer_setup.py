"""`model.base.name: framer`: a Framer checkpoint as the base of a video_lora run (docs/video_lora.md,
"Framer").

Framer's `unet/` and `controlnet/` load strictly into diffusers' stock UNet (+ `mask_token`) and our
ControlNet-SVD (`models/framer_model.py`, `controlnet_svd.py`); the VAE and CLIP encoder come from
the SVD directory as in any video_lora run. The trained module is a `FramerModel` (UNet, its LoRA,
the ControlNet); what trains follows `model.base.train_modules`. Conditioning follows Framer's
pipeline (`diffusion/framer_conditioning.py`), the objective is SVD's EDM unchanged.

The ControlNet reads `batch["controlnet_cond"]` (per-frame point heatmaps, `data/track_heatmaps.py`,
present when `data.tracks` is set). Without it the ControlNet is skipped, as Framer's pipeline skips it
without points (`with_control=False`): a run without tracks trains and evaluates the UNet alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import check_not_empty, gathered_trainable_state_dict
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.bases import FramerBase
from framer_ds.tasks.video_lora.config import VideoLoraModelConfig
from framer_ds.tasks.video_lora.diffusion import edm
from framer_ds.tasks.video_lora.encoding import EncodedClip

FRAMER_SUBFOLDERS = ("unet", "controlnet")
CONTROLNET_DIR = "controlnet"
MASK_TOKEN_FILE = "mask_token.safetensors"
"""final/'s trained mask_token (`model.train_mask_token`): {"mask_token": [1,1,C,1,1]}, Framer's key."""


class FramerSetup:
    """What a Framer base changes in the video_lora task: paths, model, conditioning, loss, export."""

    def __init__(self, options: VideoLoraModelConfig, svd_path: Path):
        assert isinstance(options.base, FramerBase), "FramerSetup serves model.base.name framer only"
        self.options = options
        self.framer: FramerBase = options.base
        self.svd_path = svd_path
        self.model = None  # the unwrapped FramerModel once built
        self.bare_unet = None  # the diffusers UNet inside it (config, added-time embedding)

    @property
    def trains_lora(self) -> bool:
        return self.framer.train_modules in ("unet_lora", "both")

    @property
    def trains_controlnet(self) -> bool:
        return self.framer.train_modules in ("controlnet", "both")

    def framer_path(self) -> Path:
        if self.framer.source.builtin:
            return default_cache_dir() / "tiny_framer"
        return Path(self.framer.source.path)

    def prepare(self) -> None:
        if self.framer.source.builtin == "tiny_framer":
            from framer_ds.tasks.video_lora.models.tiny_framer import create_tiny_framer

            create_tiny_framer(self.framer_path(), self.svd_path)

    def check(self, data_config: Any) -> list[ConfigProblem]:
        problems = []
        if not self.framer.source.builtin:
            missing = [s for s in FRAMER_SUBFOLDERS if not (self.framer_path() / s / "config.json").is_file()]
            if missing:
                problems.append(
                    ConfigProblem(
                        "model.base.source.path",
                        f"{self.framer_path()} is not a Framer directory (missing {', '.join(missing)}/"
                        "config.json); download the release once, e.g. `huggingface-cli download "
                        "wwen1997/framer_512x320 --local-dir DIR`, and point this key at DIR.",
                    )
                )
        if self.trains_controlnet and getattr(data_config, "tracks", None) is None:
            problems.append(
                ConfigProblem(
                    "model.base.train_modules",
                    f"{self.framer.train_modules!r} trains the ControlNet, which sees point heatmaps only "
                    "when data.tracks is set; set data.tracks or train_modules: unet_lora.",
                )
            )
        return problems

    # --- model ---------------------------------------------------------------------------------------

    def build_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        from framer_ds.engine.pretrained import building_empty
        from framer_ds.tasks.video_lora.models.framer_model import (
            FramerModel,
            load_framer_controlnet,
            load_framer_unet,
        )
        from framer_ds.tasks.video_lora.unet_lora import apply_lora

        empty = building_empty()
        unet = load_framer_unet(self.framer_path() / "unet", empty=empty)
        controlnet = load_framer_controlnet(self.framer_path() / CONTROLNET_DIR, empty=empty)
        controlnet.requires_grad_(self.trains_controlnet)
        mask_token = unet.mask_token.detach()
        self.bare_unet = unet
        if gradient_checkpointing:
            unet.enable_gradient_checkpointing()
            controlnet.enable_gradient_checkpointing()
        if self.trains_lora:
            unet = apply_lora(unet, self.options.lora, train_conv_in=False)  # freezes the UNet
        else:
            unet.requires_grad_(False)
        self.model = FramerModel(unet, controlnet, mask_token, self.options.train_mask_token)
        return self.model

    def optimizer_groups(self, model: torch.nn.Module) -> list[dict[str, Any]] | None:
        """With `model.mask_token_lr`: the trained mask_token in a param group of its own at that
        learning rate (the schedule scales it as the main one); None: one group for everything."""
        if self.options.mask_token_lr is None:
            return None
        token = model.mask_token
        rest = [p for p in model.parameters() if p.requires_grad and p is not token]
        return [{"params": rest}, {"params": [token], "lr": self.options.mask_token_lr}]

    def sampling(self, controlnet_cond: Tensor | None = None):
        """Sampling in training (validation samples, interp_eval): Framer's conditioning with the model's
        mask token, and the ControlNet on a clip's heatmaps [1,F,3,H,W] when it has them (eval items
        with `data.tracks`); without them the ControlNet is skipped (Framer's pipeline without points)."""
        from framer_ds.tasks.video_lora.diffusion.sampling import FramerSampling

        framer = self.framer
        return FramerSampling(
            self.model.mask_token_value,
            controlnet_cond,
            framer.controlnet_cond_scale,
            framer.controlnet_step_range,
        )

    # --- objective -----------------------------------------------------------------------------------

    def conditioning(self, encoded: EncodedClip, num_frames: int, dropout: bool) -> tuple[Tensor, Tensor]:
        """(cond [B,F,5,h,w] = latents + Framer's mask channel, CLIP embeddings [B,2,D])."""
        from framer_ds.tasks.video_lora.diffusion.framer_conditioning import (
            framer_conditioning,
            framer_dropout,
            framer_image_embeddings,
        )

        if encoded.last is None or encoded.last_image_emb is None:
            raise ValueError("a Framer batch needs the last frame's latents and CLIP embedding")
        first, last = encoded.first, encoded.last
        image_emb = framer_image_embeddings(encoded.image_emb, encoded.last_image_emb)
        if dropout:
            first, last, image_emb = framer_dropout(
                first, last, image_emb, self.options.dropout_image, self.options.dropout_latents
            )
        cond = framer_conditioning(first, last, self.model.mask_token_value, num_frames)
        return cond, image_emb

    def denoise(
        self,
        model: torch.nn.Module,
        noisy: Tensor,
        sigma: Tensor,
        cond: Tensor,
        image_emb: Tensor,
        time_ids: Tensor,
        controlnet_cond: Tensor | None,
    ) -> Tensor:
        """EDM denoiser through the FramerModel: `svd_conditioning.unet_denoise` plus the ControlNet's
        conditioning (the ControlNet gets the UNet's own 9-channel input, as in Framer's pipeline)."""
        c_skip, c_out, c_in, c_noise = edm.edm_preconditioning(sigma.to(noisy.device), ndim=noisy.ndim)
        dtype = next(self.model.unet.parameters()).dtype
        model_in = torch.cat([(c_in * noisy.float()).to(dtype), cond.to(dtype)], dim=2)
        out = model(
            model_in,
            c_noise,
            encoder_hidden_states=image_emb.to(dtype),
            added_time_ids=time_ids.to(dtype),
            controlnet_cond=None if controlnet_cond is None else controlnet_cond.to(dtype),
            conditioning_scale=self.framer.controlnet_cond_scale,
            return_dict=False,
        )[0]
        return c_skip * noisy.float() + c_out * out.float()

    # --- export --------------------------------------------------------------------------------------

    def export(self, accelerator, model: torch.nn.Module, out_dir: Path) -> dict[str, Any]:
        """final/: the UNet's peft adapter at the top (`PeftModel.from_pretrained(framer_unet, final)`)
        when a LoRA trains, the whole ControlNet in `controlnet/` when it trains, the mask_token in
        `MASK_TOKEN_FILE` when it trains. Every rank (gathers
        under ZeRO-3); returns the metadata entries that describe it."""
        state = gathered_trainable_state_dict(accelerator, model)
        framer_model = accelerator.unwrap_model(model)
        if accelerator.is_main_process:
            out_dir = Path(out_dir)
            if self.trains_lora:
                adapter = {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")}
                check_not_empty(adapter, "the UNet LoRA")
                framer_model.unet.save_pretrained(out_dir, state_dict=adapter, safe_serialization=True)
            if self.options.train_mask_token:
                token = state.get("mask_token")
                check_not_empty({"mask_token": token} if token is not None else {}, "the mask_token")
                save_file(
                    {"mask_token": token.contiguous()}, str(out_dir / MASK_TOKEN_FILE), {"format": "pt"}
                )
            if self.trains_controlnet:
                weights = {
                    k.removeprefix("controlnet."): v for k, v in state.items() if k.startswith("controlnet.")
                }
                check_not_empty(weights, "the ControlNet")
                missing = set(framer_model.controlnet.state_dict()) - set(weights)
                if missing:
                    raise RuntimeError(f"internal: ControlNet export lacks {sorted(missing)[:3]}")
                # diffusers' save_pretrained has no state_dict argument (it would write ZeRO-3's empty
                # partitions): the config and the gathered tensors, in its file layout
                folder = out_dir / CONTROLNET_DIR
                framer_model.controlnet.save_config(folder)
                tensors = {k: v.contiguous() for k, v in weights.items()}
                save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"), {"format": "pt"})
        accelerator.wait_for_everyone()
        return {
            "base": "framer",
            "framer_path": str(self.framer_path()),
            "train_modules": self.framer.train_modules,
            "controlnet_cond_scale": self.framer.controlnet_cond_scale,
            "controlnet_step_range": list(self.framer.controlnet_step_range),
            "has_adapter": self.trains_lora,
            "has_controlnet": self.trains_controlnet,
            "has_mask_token": self.options.train_mask_token,
        }

    def load_export(self, model: torch.nn.Module, export_dir: Path) -> None:
        """`framer-ds eval RUN`: what `export` wrote into the FramerModel `build_model` made: the UNet's
        peft adapter when the run trained one, `controlnet/` (strictly) when it trained the ControlNet."""
        from safetensors.torch import load_file

        export_dir = Path(export_dir)
        adapter = export_dir / "adapter_model.safetensors"
        weights = export_dir / CONTROLNET_DIR / "diffusion_pytorch_model.safetensors"
        token = export_dir / MASK_TOKEN_FILE
        wanted = [
            (self.trains_lora, adapter),
            (self.trains_controlnet, weights),
            (self.options.train_mask_token, token),
        ]
        missing = [str(p.relative_to(export_dir)) for needed, p in wanted if needed and not p.is_file()]
        if missing:
            problem = ConfigProblem(
                str(export_dir),
                f"a Framer-base export of train_modules {self.framer.train_modules!r} lacks "
                f"{', '.join(missing)}: pass the final/ or best/ of a finished run",
            )
            raise ConfigError([problem], "eval")
        if self.trains_lora:
            load_peft_adapter(model.unet, export_dir)
        if self.trains_controlnet:
            model.controlnet.load_state_dict(load_file(weights), strict=True)
        if self.options.train_mask_token:
            with torch.no_grad():
                model.mask_token.copy_(read_mask_token(export_dir).reshape(model.mask_token.shape))


def read_mask_token(export_dir: Path) -> Tensor:
    """The trained mask_token of an export (`MASK_TOKEN_FILE`), with a clear error when it is absent."""
    from safetensors.torch import load_file

    path = Path(export_dir) / MASK_TOKEN_FILE
    if not path.is_file():
        problem = ConfigProblem(
            str(export_dir),
            f"its metadata says the run trained the mask_token but {MASK_TOKEN_FILE} is missing: pass a "
            "complete final/ or best/ of the run",
        )
        raise ConfigError([problem], "loading the export")
    return load_file(str(path))["mask_token"]
