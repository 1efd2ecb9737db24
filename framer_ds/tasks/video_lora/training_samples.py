"""What the video_lora task samples during training: validation videos every `model.samples.every`
steps and the interpolated frames `model.interp_eval` scores.

Why a mixin (as eval_memory.VideoEvalMemory): both run the model being trained through the base
family's sampler (`VideoBaseFamily.training_sampler`: SVD/Framer's or Wan's) with the task's frozen
encoders and sampling inputs, so these methods need the task; they live apart from the objective
because sampling is a loop of its own (a scheduler, many denoiser calls, a decode), not a loss.
"""

from __future__ import annotations

from pathlib import Path

import torch


class VideoTrainingSamples:
    """`write_samples`, `sample_every` and interp_eval's sampling, mixed into `VideoLoraTask` (they need
    its config, base family, frozen encoders and the sampling inputs it keeps)."""

    def _interp_eval(self, model, batch) -> dict[str, torch.Tensor]:
        """`model.interp_eval` (`interp_eval.py`) with the base family's sampler; every rank calls it
        (ZeRO-3 collectives). Under the latent cache the encoders stay lent until the next step."""
        from framer_ds.tasks.video_lora.interp_eval import interp_eval_batch

        self.frozen.lent = self.config.data.cache.enabled  # until the next training step
        return interp_eval_batch(self.family.training_sampler(model), batch, self.config.model)

    def sample_every(self) -> int:
        return self.config.model.samples.every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """`model.samples.count` videos from held-out first (and last) frames, written under
        out_dir/step_N/ by the base family's sampler; every rank takes part (ZeRO-3 forwards are
        collectives)."""
        from framer_ds.tasks.video_lora.validation_samples import collect_sample_inputs, write_sample_round

        options = self.config.model
        if self._sample_inputs is None:
            self._sample_inputs = collect_sample_inputs(
                self._raw_eval_or_train,
                options.samples,
                interpolation=options.base.mode == "interpolation",
                with_reference=not self.uses_pairs,
                fps=options.fps,
                cached=self._cached_eval_or_train,
            )
        sampler = self.family.training_sampler(model)
        was_training = model.training
        model.eval()
        try:
            return write_sample_round(
                accelerator,
                sampler,
                self._sample_inputs,
                options.samples,
                self.config.data.num_frames,
                Path(out_dir) / f"step_{step}",
            )
        finally:
            model.train(was_training)
            if self.config.data.cache.enabled:
                self.frozen.release()
