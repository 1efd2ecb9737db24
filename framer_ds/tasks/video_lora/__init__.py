"""`video_lora`: LoRA fine-tuning of Stable Video Diffusion (image-to-video, interpolation)."""
