"""video_lora's networks: Framer's UNet + ControlNet, and the tiny SVD/Framer stand-ins (tests, benches)."""
