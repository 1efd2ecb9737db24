"""Stable Video Diffusion training pieces: EDM objective, pipeline-exact conditioning, tiny test model."""
