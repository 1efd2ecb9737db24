"""video_lora's shared data: videos and their index, clips, buckets, synthetic clips, the latent cache and
the mp4 writer (a family's own data, SVD's motion scores and Framer's point tracks, lives in its folder)."""
