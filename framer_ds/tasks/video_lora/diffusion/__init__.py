"""video_lora's diffusion: the EDM objective, SVD/Framer conditioning, temporal context and the sampler."""
