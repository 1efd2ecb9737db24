"""The Wan 2.x image-to-video / first-last-frame library: conditions, sampler and LoRA layouts, each the
diffusers `WanImageToVideoPipeline`'s own computation (0.42.1) stepped by the base folder's own scheduler,
so a LoRA trained here samples in diffusers and ComfyUI exactly as it does in `framer-ds sample`."""
