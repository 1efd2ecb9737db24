"""video_lora's interpolation metrics (PSNR/SSIM/LPIPS and the rest of the interp eval)."""
