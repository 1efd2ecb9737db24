"""Stable Video Diffusion under EDM: its options, family, encoders, conditioning, objective, UNet LoRA,
sampler, motion scores, pre-flight, exports and the tiny test base. Imports `shared/` only."""
