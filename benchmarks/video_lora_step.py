"""s/step and peak memory of a tiny video_lora config (`--config`: tiny.yaml, the SVD base, or
wan_tiny.yaml, the Wan base), with the frozen encoders encoding every step vs reading the latent cache
(`data.cache.enabled`): the VAE + CLIP for SVD; the VAE, CLIP and UMT5 text encoder for Wan, whose cache
holds the prompt and image embeddings too.

Why: the cache's promise is that the frozen VAE and image encoder leave the device and stop costing
time every step; this measures both on whatever machine runs it (CPU here; on a GPU pass
`--height 576 --width 576 --frames 10` for the seed's resolution). Each mode is its own
`framer-ds train` process, so peak memory is per mode: CUDA max allocated on a GPU, resident set
size on CPU. The step time is the median of the per-step `samples_per_s` lines (log_every 1) after
two warm-up steps; the cache is built before the timed run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from report import write_section

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "tasks" / "video_lora"
SECTION = "## video_lora_step"


def section_title(config: Path) -> str:
    """One section per config: the SVD tiny config keeps the original title."""
    return SECTION if config.stem == "tiny" else f"{SECTION} ({config.stem})"


def run_mode(out: Path, cache: bool, args: argparse.Namespace) -> dict[str, float]:
    overrides = [
        f"output_dir={out}",
        f"data.height={args.height}",
        f"data.width={args.width}",
        f"data.num_frames={args.frames}",
        "data.stride=1",
        f"train.length.steps={args.steps}",
        "train.log_every=1",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "train.micro_batch_size=1",
        f"train.mixed_precision={'bf16' if torch.cuda.is_available() else 'no'}",
        "model.samples.every=0",
        f"data.cache.enabled={str(cache).lower()}",
        f"data.cache.dir={out.parent / 'latents'}",
    ]
    cmd = [sys.executable, "-m", "framer_ds", "train", str(args.config), *overrides]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in lines if "samples_per_s" in x][2:]  # skip warm-up
    memory = next(k for k in ("memory/max_allocated_gb", "memory/rss_gb") if k in lines[0])
    return {
        "s_per_step": statistics.median(1.0 / x["samples_per_s"] for x in lines),
        "peak_gb": max(x[memory] for x in lines),
        "memory_key": memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "tiny.yaml", help="a tiny video_lora config")
    parser.add_argument("--height", type=int, help="default 128 (SVD), 64 (Wan)")
    parser.add_argument("--width", type=int, help="default 128 (SVD), 64 (Wan)")
    parser.add_argument("--frames", type=int, help="default 8 (SVD), 9 (Wan: 4k + 1 frames)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    wan = "wan" in args.config.stem
    args.height = args.height or (64 if wan else 128)
    args.width = args.width or (64 if wan else 128)
    args.frames = args.frames or (9 if wan else 8)
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for cache in (False, True):
            if cache:  # build the cache first, so the timed run only reads it
                run_mode(Path(tmp) / "warm", True, argparse.Namespace(**{**vars(args), "steps": 3}))
            results[cache] = run_mode(Path(tmp) / f"cache_{cache}", cache, args)
        entries = list((Path(tmp) / "latents").rglob("entry_*.safetensors"))
        cache_mib = sum(p.stat().st_size for p in entries) / 2**20
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    memory_name = "CUDA max allocated" if results[False]["memory_key"].endswith("allocated_gb") else "RSS"
    rows = "\n".join(
        f"| {'latent cache' if cache else 'encode every step'} | {r['s_per_step']:.3f} | {r['peak_gb']:.2f} |"
        for cache, r in results.items()
    )
    title = section_title(args.config)
    base = "Wan (FLF2V: VAE, CLIP, UMT5)" if wan else "SVD (VAE, CLIP)"
    section = (
        f"{title}\n\n"
        f"`python {' '.join(shlex.quote(a) for a in sys.argv)}` on {device}, {platform.python_version()}, "
        f"torch {torch.__version__}, {dt.date.today()}. Tiny random {base} components, "
        f"{args.frames} frames at {args.height}x{args.width}, micro batch 1, {args.steps} steps.\n\n"
        f"| mode | s/step (median) | peak {memory_name} (GiB) |\n| --- | --- | --- |\n{rows}\n\n"
        f"Step time ratio cache / encode: {results[True]['s_per_step'] / results[False]['s_per_step']:.2f}. "
        f"Cache on disk: {cache_mib:.1f} MiB for {len(entries)} clips (train + eval).\n"
    )
    print(section)
    if args.write:
        write_section(args.write, title, section)


if __name__ == "__main__":
    main()
