"""framer_ds: one Accelerate + DeepSpeed training loop for video-diffusion LoRAs, ViTs and TTS LMs."""

__version__ = "0.2.0"
