"""DeepSpeed's universal checkpoint: a ZeRO checkpoint rewritten so it loads at ANY world size.

Why this exists:
- A DeepSpeed ZeRO checkpoint holds one optimizer shard per data-parallel rank
  (`pytorch_model/zero_pp_rank_R_mp_rank_00_optim_states.pt`); DeepSpeed refuses to load it at another
  world size ("Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not
  currently supported"). Its own converter, `deepspeed.checkpoint.ds_to_universal`, rewrites the shards
  as one full fp32/exp_avg/exp_avg_sq tensor per parameter (`zero/<param>/*.pt`), which an engine built
  with `"checkpoint": {"load_universal": true}` slices for ANY world size.
- That flag is read once, when `deepspeed.initialize` parses the config (`DeepSpeedEngine._config`), so it
  must be set in the plugin's config BEFORE `accelerator.prepare`; setting it later has no effect.
- The conversion is written once, atomically, INSIDE the checkpoint (`step_N/universal/`), so keep-last-K
  pruning of `step_N` removes it too and a later resume at yet another world size reuses it. Its layout is
  what `accelerator.load_state` expects: the converted engine files under the tag `pytorch_model` (the tag
  accelerate passes to `engine.load_checkpoint`), next to copies of scheduler.bin, random_states_*.pkl,
  trainer_state.json and latest.

When to convert is decided in `strategy.py`; the data position at the new world size in `world_size.py`.
`framer-ds checkpoint universal OUTPUT_DIR/checkpoints/step_N` converts ahead of time (e.g. for a
model so large that the conversion would outlast the collective timeout the other ranks wait under).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from accelerate import Accelerator

from framer_ds.storage.atomic import building_dir, publish_dir
from framer_ds.storage.disk_space import reporting_full_disk

DS_TAG = "pytorch_model"  # accelerate's MODEL_NAME: the tag save_state/load_state give the DeepSpeed engine
UNIVERSAL_DIR = "universal"
_LATEST_UNIVERSAL = "latest_universal"  # written by ds_to_universal next to its output folder


def zero_shard_count(checkpoint: Path) -> int:
    """Optimizer shards in a DeepSpeed ZeRO checkpoint = the data-parallel world size that wrote it; 0 if
    `checkpoint` is not one. Counted from the files (not trainer_state.json) because that is what
    DeepSpeed itself checks, and checkpoints from before `world_size` was recorded lack the field."""
    return len(list((Path(checkpoint) / DS_TAG).glob("*optim_states.pt")))


def is_universal(checkpoint: Path) -> bool:
    """True for a directory that holds a converted (world-size independent) universal checkpoint."""
    checkpoint = Path(checkpoint)
    return (checkpoint / _LATEST_UNIVERSAL).is_file() and (checkpoint / DS_TAG / "zero").is_dir()


def enable_universal_loading(accelerator: Accelerator) -> None:
    """Make the DeepSpeed engine read universal checkpoints. Must run before `accelerator.prepare`."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        raise RuntimeError("internal: universal checkpoint loading requested without DeepSpeed")
    plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True


def convert_to_universal(checkpoint: Path) -> Path:
    """Write `checkpoint/universal/` with DeepSpeed's converter; atomic (staging dir + rename). One process.

    The converter runs as a subprocess: it forks worker pools and loads every shard at once, which must
    not happen inside a training process holding a process group (and its memory is freed on exit).
    `--inject_missing_state` is needed for ZeRO-1/2: the converter asserts on `universal_checkpoint_info`,
    which DeepSpeed only records for Megatron-style models, never for a plain torch/HF module.
    """
    checkpoint = Path(checkpoint)
    final = checkpoint / UNIVERSAL_DIR
    kept = f"{checkpoint.name} itself is untouched"
    fix = "Free space there and run again (or resume at the world size that wrote the checkpoint)"
    with reporting_full_disk(checkpoint, 0, None, kept=kept, fix=fix), building_dir(final) as staging:
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(checkpoint / DS_TAG),
            "--output_folder",
            str(staging / DS_TAG),
            "--inject_missing_state",
            "--num_extract_workers",
            str(max(1, min(4, os.cpu_count() or 1))),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"DeepSpeed's ds_to_universal failed on {checkpoint} (exit {proc.returncode}); resume at the "
                f"world size that wrote it instead. Command: {' '.join(cmd)}\n{proc.stdout[-2000:]}"
                f"{proc.stderr[-3000:]}"
            )
        # Everything accelerate reads besides the engine's files, plus trainer_state.json / latest, so the
        # converted directory is itself a complete checkpoint (`train.resume` may point at it). DeepSpeed's
        # zero_to_fp32.py / zero_to_torch.py read sharded files only: they stay with the original.
        for entry in checkpoint.iterdir():
            if entry.name in (DS_TAG, UNIVERSAL_DIR) or entry.name.startswith(("zero_to_", ".")):
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
    publish_dir(staging, final)
    return final
