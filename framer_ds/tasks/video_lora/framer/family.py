"""`model.base.name: framer`: a Framer checkpoint as the base of a video_lora run (docs/video_lora.md,
"Framer"), as `FramerFamily`: the SVD family (svd/family.py) extended one way, overriding its hooks.

Framer's `unet/` and `controlnet/` load strictly into diffusers' stock UNet (+ `mask_token`) and our
ControlNet-SVD (`framer/model.py`, `framer/controlnet.py`); the VAE and CLIP encoder come from
the SVD directory as in any video_lora run. The trained module is a `FramerModel` (UNet, its LoRA,
the ControlNet); what trains follows `model.base.train_modules`. Conditioning follows Framer's
pipeline (`framer/conditioning.py`), the objective is SVD's EDM unchanged.

The ControlNet reads `batch["controlnet_cond"]` (per-frame point heatmaps, `framer/tracks/heatmaps.py`,
present when `data.tracks` is set). Without it the ControlNet is skipped, as Framer's pipeline skips it
without points (`with_control=False`): a run without tracks trains and evaluates the UNet alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.framer.export import (
    CONTROLNET_DIR,
    FRAMER_EXPORT_FORMATS,
    load_framer_weights,
    save_framer_weights,
)
from framer_ds.tasks.video_lora.framer.options import FramerBase, FramerSampleFlags
from framer_ds.tasks.video_lora.svd import edm
from framer_ds.tasks.video_lora.svd.encoding import EncodedClip
from framer_ds.tasks.video_lora.svd.family import SvdFamily
from framer_ds.tasks.video_lora.svd.options import SvdSampleFlags

FRAMER_SUBFOLDERS = ("unet", "controlnet")


class FramerFamily(SvdFamily):
    """What a Framer base changes in the SVD family: paths, model, conditioning, denoiser, datasets
    (point tracks), export, sampler parts."""

    embeds_last_frame = True  # Framer's conditioning holds the CLIP embeddings of both given frames
    sample_flags = (SvdSampleFlags, FramerSampleFlags)  # + the trajectory ControlNet's

    def __init__(self, config: Any):
        super().__init__(config)
        assert isinstance(config.model.base, FramerBase), "FramerFamily serves model.base.name framer only"
        self.options = config.model
        self.framer: FramerBase = config.model.base
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
        super().prepare()
        if self.framer.source.builtin == "tiny_framer":
            from framer_ds.tasks.video_lora.framer.tiny import create_tiny_framer

            create_tiny_framer(self.framer_path(), self.base_path())

    def track_problems(self) -> list[ConfigProblem]:
        from framer_ds.tasks.video_lora.framer.tracks.setup import track_problems

        return track_problems(self.config.data)

    def base_problems(self) -> list[ConfigProblem]:
        """The Framer checkpoint's folders, and a trained ControlNet without tracks to see."""
        data_config, problems = self.config.data, []
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
        if self.trains_controlnet and data_config.tracks is None:
            problems.append(
                ConfigProblem(
                    "model.base.train_modules",
                    f"{self.framer.train_modules!r} trains the ControlNet, which sees point heatmaps only "
                    "when data.tracks is set; set data.tracks or train_modules: unet_lora.",
                )
            )
        return problems

    # --- data ----------------------------------------------------------------------------------------

    @property
    def clip_placement(self) -> bool:
        """With data.tracks each clip carries its placement (start, stride, crop, flip): the tracks
        follow it."""
        return self.config.data.tracks is not None

    def datasets(self, built: Any, data: Any) -> tuple[Dataset, Dataset | None]:
        """SVD's datasets, and with data.tracks each item's `controlnet_cond` (Framer's heatmaps of its
        clip's point tracks; analytic tracks are exact and cheap: built here, no `data tracks` step)."""
        from framer_ds.tasks.video_lora.framer.tracks.setup import build_tracks, with_controlnet_cond

        train, val = super().datasets(built, data)
        tracks = self.config.data.tracks
        if tracks is None:
            return train, val
        if tracks.tracker == "analytic":
            build_tracks(data)
        seed = self.config.train.seed
        records = list(train.records) + list(val.records if val else [])
        return (
            with_controlnet_cond(train, records, tracks, seed),
            with_controlnet_cond(val, records, tracks, seed),
        )

    def cached_datasets(
        self, train: Dataset, val: Dataset | None, records: list[Any]
    ) -> tuple[Dataset, Dataset | None]:
        """The latent cache's datasets with `controlnet_cond`, computed at load from each entry's clip
        placement (`records`: the videos whose tracks the items use)."""
        from framer_ds.tasks.video_lora.framer.tracks.setup import with_controlnet_cond

        tracks = self.config.data.tracks
        if tracks is None:
            return train, val
        seed = self.config.train.seed
        return with_controlnet_cond(train, records, tracks, seed), with_controlnet_cond(
            val, records, tracks, seed
        )

    def compute_tracks(self, data: Any, shard: tuple[int, int]) -> str:
        from framer_ds.tasks.video_lora.framer.tracks.setup import build_tracks

        return build_tracks(data, shard)

    # --- model ---------------------------------------------------------------------------------------

    def _build_unet(self, gradient_checkpointing: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        model = self.build_framer_model(gradient_checkpointing)
        return self.bare_unet, model  # the UNet's config + added-time embedding, as for SVD

    def conv_in_extra_channels(self) -> int:
        """None: Framer's UNet takes the mask channel already (9 inputs in its checkpoint)."""
        return 0

    def build_framer_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        from framer_ds.engine.pretrained import building_empty
        from framer_ds.tasks.video_lora.framer.model import (
            FramerModel,
            load_framer_controlnet,
            load_framer_unet,
        )
        from framer_ds.tasks.video_lora.svd.unet import apply_lora

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
        from framer_ds.tasks.video_lora.framer.conditioning import FramerSampling

        framer = self.framer
        return FramerSampling(
            self.model.mask_token_value,
            controlnet_cond,
            framer.controlnet_cond_scale,
            framer.controlnet_step_range,
        )

    # --- objective -----------------------------------------------------------------------------------

    def _conditioning(self, encoded: EncodedClip, num_frames: int, dropout: bool) -> tuple[Tensor, Tensor]:
        """(cond [B,F,5,h,w] = latents + Framer's mask channel, CLIP embeddings [B,2,D])."""
        from framer_ds.tasks.video_lora.framer.conditioning import (
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

    def _unet_denoise(self, model, noisy, sigma, cond, image_emb, time_ids, batch) -> Tensor:
        """EDM denoiser through the FramerModel: `svd/conditioning.unet_denoise` plus the ControlNet's
        conditioning on the batch's heatmaps (the ControlNet gets the UNet's own 9-channel input, as in
        Framer's pipeline)."""
        controlnet_cond = batch.get("controlnet_cond")
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

    def cache_description(self, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
        """SVD's, + the base (its entries hold the last frame's embedding)."""
        return {**super().cache_description(dataset, split, copies, dtype), "base": "framer"}

    def example_batch(self, config: Any, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """SVD's (with the last frame's embedding), + the ControlNet's heatmaps at pixel size."""
        batch = super().example_batch(config, micro_batch_size)
        data = config.data
        if data.tracks is not None:
            batch["controlnet_cond"] = torch.zeros(
                micro_batch_size, data.num_frames, 3, data.height, data.width
            )
        return batch

    def sampling_source(self) -> FramerFamily:
        return self

    # --- export --------------------------------------------------------------------------------------

    def _export_weights(self, accelerator, model: torch.nn.Module, out_dir: Path) -> dict[str, Any]:
        """final/: the trained UNet LoRA, ControlNet and mask_token (framer/export.py)."""
        return save_framer_weights(self, accelerator, model, out_dir)

    def load_export(self, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """`framer-ds eval RUN`: what `export` wrote, into the FramerModel `build_model` made."""
        load_framer_weights(self, model, Path(export_dir))
        return model

    def sampler_parts(self, adapter_dir, metadata, options, num_frames, device, dtype):
        """Framer's UNet, ControlNet and conditioning convention with the flags' tracks and ControlNet
        settings (the tracks file is read before any model loads)."""
        from framer_ds.tasks.video_lora.framer.sampling import framer_sampler_parts_for

        return framer_sampler_parts_for(adapter_dir, metadata, options, num_frames, device, dtype)

    def sample_record_fields(
        self, metadata: dict[str, Any], options: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The `--tracks` file the sample used, and the Framer checkpoint the export builds on."""
        tracks = str(options.tracks) if options.tracks is not None else None
        return {"tracks": tracks}, {"framer_path": metadata.get("framer_path")}

    def export_formats(self) -> dict[str, Any]:
        """peft (with the trained ControlNet and mask_token), merged (Framer's UNet), framer; comfyui is
        SVD's, which refuses an interpolation model."""
        return {**super().export_formats(), **FRAMER_EXPORT_FORMATS}

    def smoke_bases(self) -> list[tuple[str, Any, Any, str]]:
        """SVD-XT's directory and Framer's (`unet/` + `controlnet/`), each when the config names it."""
        from framer_ds.tasks.video_lora.framer.smoke_base import create_smoke_framer

        path = self.config.model.base.source.path
        framer = [] if path is None else [("model.base.source.path", path, create_smoke_framer, "Framer")]
        return super().smoke_bases() + framer

    def smoke_export_format(self) -> str:
        """Framer's release layout."""
        return "framer"
