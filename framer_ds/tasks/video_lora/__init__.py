"""`video_lora`: LoRA fine-tuning of video diffusion bases, image-to-video or first/last-frame interpolation:
Stable Video Diffusion (`svd/`), Framer (`framer/`, SVD's family extended) and Wan 2.1/2.2 (`wan/`), on
what every base shares (`shared/`). The root holds the task, its config assembly, the family registry and
the task's commands (docs/video_lora.md, "Code map")."""
