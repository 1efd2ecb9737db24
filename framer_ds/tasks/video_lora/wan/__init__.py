"""Wan 2.1 / 2.2 image-to-video and first-last-frame bases under rectified flow: options, family, encoders,
conditions, sampler and LoRA layouts, each the diffusers `WanImageToVideoPipeline`'s own computation
(0.42.1) stepped by the base folder's own scheduler, so a LoRA trained here samples in diffusers and
ComfyUI exactly as it does in `framer-ds sample`. Imports `shared/` only."""
