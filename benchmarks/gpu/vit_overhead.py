"""Step 3: ViT-L/16 at 224 px, bf16, the largest micro-batch that fits: framer_ds's samples/s beside a
minimal hand-written accelerate loop (hand_loop.py) on the same model, data and launch, per strategy.

Why: framer_ds adds bookkeeping to every step (loss windows, the non-finite check, metrics lines, tqdm);
on a GPU step of a real model that must cost almost nothing. The micro-batch is `framer-ds plan`'s
largest for the strategy on this GPU (halved on an out-of-memory), so both loops run where users run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cells import CONFIGS, REPO, Cell, measure_cell, steps_for

VIT_LARGE = {
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "hidden_dropout_prob": 0.0,
}
STRATEGIES = ("plain", "zero2", "zero3")
MAX_MICRO_BATCH = 512


def base_overrides(smoke: bool) -> list[str]:
    if smoke:  # the quickstart's small ViT on CPU
        return ["train.mixed_precision=no", "train.num_workers=0"]
    return [
        *(f"model.source.config.{key}={value}" for key, value in VIT_LARGE.items()),
        "data.image_size=224",
        "train.mixed_precision=bf16",
        "train.gradient_checkpointing=false",
        "train.num_workers=8",
    ]


def largest_micro_batch(strategy: str, overrides: list[str]) -> int:
    """The plan's largest micro-batch for `strategy` on this one GPU."""
    import torch

    from framer_ds.lab.hardware import Hardware
    from framer_ds.lab.planner import make_plan

    total = torch.cuda.get_device_properties(0).total_memory
    plan = make_plan(
        CONFIGS / "quickstart.yaml",
        [*overrides, f"train.micro_batch_size={MAX_MICRO_BATCH}"],
        Hardware(1, 1, total),
        CONFIGS / "deepspeed",
        strategies=["ddp" if strategy == "plain" else strategy],
    )
    return max(1, min(plan.rows[0].largest_micro_batch, MAX_MICRO_BATCH))


def hand_loop_rate(cell: Cell, out_dir: Path, port: int, steps: int) -> float:
    """samples/s of the hand-written loop under the same `accelerate launch` flags as `cell`."""
    import torch

    from framer_ds.lab.bench import launch_args
    from framer_ds.lab.measure import accelerate_launch_command, measurement_env
    from framer_ds.storage.locations import default_cache_dir

    args = launch_args(
        cell.strategy,
        cell.processes,
        CONFIGS / "deepspeed",
        torch.cuda.is_available(),
        accelerate_dir=CONFIGS,
    )
    overrides = [*cell.overrides, f"train.length.steps={steps}", f"output_dir={out_dir / 'hand_run'}"]
    script = Path(__file__).with_name("hand_loop.py")
    command = accelerate_launch_command(args, port, script, [str(cell.config), str(out_dir), *overrides])
    env = measurement_env(default_cache_dir(), pythonpath=REPO)
    env.pop("LD_PRELOAD", None)  # no allocation counter: only time is compared
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the hand-written loop failed:\n{done.stderr[-3000:]}")
    record = json.loads((out_dir / "hand_loop_rank0.json").read_text())
    stamps = record["stamps"][2:]  # the same warm-up as framer_ds's cell: steps 3..N are timed
    s_per_step = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
    return record["micro_batch"] * record["processes"] / s_per_step


def run(work: Path, smoke: bool, port: int) -> list[dict[str, Any]]:
    records = []
    for strategy in ("plain",) if smoke else STRATEGIES:
        overrides = base_overrides(smoke)
        micro_batch = 32 if smoke else largest_micro_batch(strategy, overrides)
        for attempt in range(3):  # an out-of-memory halves the micro-batch
            model = "quickstart ViT" if smoke else "ViT-L/16 224"
            cell = Cell(
                "vit_overhead",
                f"{model} / {strategy} / micro-batch {micro_batch}",
                CONFIGS / "quickstart.yaml",
                (*overrides, f"train.micro_batch_size={micro_batch}", "train.gradient_accumulation_steps=1"),
                strategy,
            )
            cell_dir = work / f"vit_{strategy}_{attempt}"
            record = measure_cell(cell, cell_dir, port, steps_for(smoke))
            port += 1
            if record["ok"] or "out of memory" not in record.get("error", "").lower() or micro_batch == 1:
                break
            micro_batch //= 2
        if record["ok"]:
            try:
                hand = hand_loop_rate(cell, cell_dir, port, steps_for(smoke))
            except RuntimeError as exc:
                record["note"] = str(exc).splitlines()[-1][:300]
            else:
                record["hand_loop_samples_per_s"] = hand
                record["overhead_ratio"] = hand / record["samples_per_s"]
            port += 1
        records.append(record)
    return records


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]), "--smoke" in sys.argv, 29700 + os.getpid() % 100)))
