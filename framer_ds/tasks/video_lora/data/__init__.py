"""video_lora's data: videos and their index, clips, synthetic clips, point tracks and their heatmaps,
motion scores, the latent cache and the mp4 writer."""
