"""What the video_lora task samples during training: validation videos every `model.samples.every`
steps and the interpolated frames `model.interp_eval` scores.

Why a mixin (as eval_memory.VideoEvalMemory): both run the model being trained with the task's frozen
VAE and image encoder and its Framer setup, so these methods need the task; they live apart from the
objective because sampling is a loop of its own (a scheduler, many denoiser calls, a decode), not a
loss.
"""

from __future__ import annotations

from pathlib import Path

import torch


class VideoTrainingSamples:
    """`write_samples`, `sample_every` and interp_eval's sampling, mixed into `VideoLoraTask` (they need
    its config, frozen encoders, Framer setup and the sampling inputs it keeps)."""

    def _interp_eval(self, model, batch) -> dict[str, torch.Tensor]:
        """`model.interp_eval` (`interp_eval.py`); every rank calls it (ZeRO-3 collectives)."""
        from framer_ds.tasks.video_lora.interp_eval import interp_eval_batch

        self.frozen.lent = self.config.data.cache.enabled  # until the next training step
        framer = self.framer.sampling if self.framer is not None else None
        return interp_eval_batch(self._sampler_parts(model), batch, self.config.model, framer)

    def _sampler_parts(self, model):
        """The model being trained with the frozen VAE and encoder on the device and SVD's scheduler."""
        from diffusers import EulerDiscreteScheduler

        from framer_ds.tasks.video_lora.diffusion.sampling import SamplerParts

        vae, encoder = self.frozen.on_device(self.accelerator)
        scheduler = EulerDiscreteScheduler.from_pretrained(self.family.svd_path(), subfolder="scheduler")
        return SamplerParts(model, self.family.unet_config, vae, encoder, scheduler)

    def sample_every(self) -> int:
        return self.config.model.samples.every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """`model.samples.count` videos from held-out first (and last) frames, written under
        out_dir/step_N/; every rank takes part (ZeRO-3 forwards are collectives)."""
        from framer_ds.tasks.video_lora.validation_samples import collect_sample_inputs, write_sample_round

        options = self.config.model
        if self._sample_inputs is None:
            self._sample_inputs = collect_sample_inputs(
                self._raw_eval_or_train,
                options.samples,
                interpolation=options.base.mode == "interpolation",
                with_reference=not self.uses_pairs,
                fps=options.fps,
            )
        parts = self._sampler_parts(model)
        was_training = model.training
        model.eval()
        try:
            return write_sample_round(
                accelerator,
                parts,
                self._sample_inputs,
                options.samples,
                self.config.data.num_frames,
                options.fixed_motion_bucket,
                Path(out_dir) / f"step_{step}",
                tile_size=options.vae_tile_size,
                framer=self.framer.sampling() if self.framer is not None else None,
            )
        finally:
            model.train(was_training)
            if self.config.data.cache.enabled:
                self.frozen.release()
