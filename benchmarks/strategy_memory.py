"""Per-rank peak ALLOCATED memory and s/step of every strategy, on the models our users fine-tune.

Why: users pick ZeRO to save memory, and with DeepSpeed buffers sized for a 175B model it did the
opposite at our sizes; RSS hid it (it counts touched pages, while a GPU's allocator must provide every
allocated byte). This runs `run_training` for real under `accelerate launch` per strategy and model and
reads, after every optimizer step, the peak of all allocations so far: on a CPU from the allocation
counter preloaded into every process (benchmarks/alloc_counter, built here: every malloc-family
allocation and every mapping, safetensors files included), on a GPU `torch.cuda.max_memory_allocated`.
The cell is the largest over the ranks, through the last training step (eval at the end and the export
are not in it).
POSIX shared memory (/dev/shm: DataLoader batches in flight; DeepSpeed's CPU allreduce workspace under
its own launcher) is listed under the table when there is any, not in the cells: shared pages belong to
every rank that maps them. Under `accelerate launch` (this benchmark) it was 0 for every cell.

Models (random weights, built from configs; each trains `--steps` optimizer steps, fp32 on CPU):
- vit_85m: ViT-B/16 (85.7M parameters) full fine-tune, 96 px (36 patches: the strategy terms, not
  activations, are what this compares), micro-batch 2.
- unet_lora: LoRA rank 64 on a frozen ~100M SVD-style UNet (framer_ds.tasks.video_lora.models.tiny_svd
  SVD_STYLE_100M_UNET), 4 frames 64x64, micro-batch 1.
- tiny_lora: configs/tasks/video_lora/tiny.yaml as shipped (LoRA rank 4 on the tiny SVD).

`--code DIR` runs another checkout's framer_ds and its configs/deepspeed JSONs (e.g. a worktree of the
commit before a change: the "before" column); the instruments here stay the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from alloc_counter.alloc_counter import cpu_counter_env

from framer_ds.lab.bench import launch_args
from framer_ds.lab.measure import describe_machine, measure_launch, measurement_env

REPO = Path(__file__).resolve().parents[1]
SECTION = "## strategy_memory"
STRATEGIES = ("plain", "ddp", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp2")
MODELS = ("vit_85m", "unet_lora", "tiny_lora")


# --- the driver ----------------------------------------------------------------------------------------


def _vit_config() -> dict:
    return {
        "task": "vit_classification",
        "model": {
            "source": {
                "config": {
                    "image_size": 96,
                    "patch_size": 16,
                    "num_channels": 3,
                    "hidden_size": 768,
                    "num_hidden_layers": 12,
                    "num_attention_heads": 12,
                    "intermediate_size": 3072,
                }
            }
        },
        "data": {"source": {"builtin": "digits"}, "image_size": 96},
        "train": {"micro_batch_size": 2},
    }


def _unet_lora_config(svd_dir: Path) -> dict:
    return {
        "task": "video_lora",
        "model": {
            "source": {"path": str(svd_dir)},
            "base": {"name": "svd", "mode": "interpolation"},
            "lora": {"rank": 64},
        },
        "data": {
            "source": {"builtin": "synthetic_clips"},
            "num_frames": 4,
            "stride": 2,
            "height": 64,
            "width": 64,
        },
        "train": {"micro_batch_size": 1},
    }


def _tiny_lora_config(code: Path) -> dict:
    import yaml

    config = yaml.safe_load((code / "configs/tasks/video_lora/tiny.yaml").read_text())
    config["model"]["samples"]["every"] = 0
    return config


def training_config(model: str, code: Path, work: Path, steps: int) -> dict:
    if model == "vit_85m":
        config = _vit_config()
    elif model == "unet_lora":
        from framer_ds.tasks.video_lora.models.tiny_svd import SVD_STYLE_100M_UNET, create_tiny_svd

        config = _unet_lora_config(create_tiny_svd(work / "svd_100m", unet_overrides=SVD_STYLE_100M_UNET))
    else:
        config = _tiny_lora_config(code)
    train = config.setdefault("train", {})
    for section in ("eval", "checkpoint"):
        train.setdefault(section, {})["every"] = None
    train.setdefault("lr_schedule", {})["warmup"] = None
    train.update(
        seed=0,
        length={"steps": steps},
        gradient_accumulation_steps=1,
        mixed_precision="no",
        log_every=1,
    )
    config["log"] = {"tensorboard": False}
    return config


def measure(model: str, strategy: str, code: Path, work: Path, steps: int, processes: int, env: dict) -> dict:
    import yaml

    run_dir = work / f"{model}_{strategy}"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = training_config(model, code, work, steps)
    config["output_dir"] = str(run_dir / "out")
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = 29500 + os.getpid() % 1000
    import torch

    gpu = torch.cuda.is_available()
    args = launch_args(strategy, processes, code / "configs/deepspeed", gpu, accelerate_dir=code / "configs")
    found = measure_launch(config_path, [], args, run_dir, env, code, port)
    if found.steps != steps:
        raise RuntimeError(f"{model} / {strategy}: {found.steps} optimizer-step hooks for {steps} steps")
    return {
        "peak_mib": found.peak_bytes / 2**20,
        "run_mib": found.run_bytes / 2**20,
        "steady_mib": found.steady_bytes / 2**20,
        "tensor_run_mib": found.tensor_run_bytes / 2**20,
        "tensor_steady_mib": found.tensor_steady_bytes / 2**20,
        "shared_mib": found.shared_bytes / 2**20,
        "rss_mib": found.rss_bytes / 2**20,
        "s_per_step": found.s_per_step,
        "wall_s": found.wall_s,
        "processes": found.processes,
    }


def table(results: dict[tuple[str, str], dict], models: list[str], strategies: list[str]) -> list[str]:
    head = "| model | " + " | ".join(strategies) + " |"
    rows = [head, "|---" * (len(strategies) + 1) + "|"]
    for model in models:
        cells = []
        for strategy in strategies:
            r = results.get((model, strategy))
            cells.append(
                "-"
                if r is None
                else f"{r['run_mib']:.0f} / {r['steady_mib']:.0f} MiB, {r['s_per_step']:.2f} s"
            )
        rows.append(f"| {model} | " + " | ".join(cells) + " |")
    shared = {
        s: max(r["shared_mib"] for (_, strategy), r in results.items() if strategy == s)
        for s in strategies
        if any(strategy == s and r.get("shared_mib", 0) >= 1 for (_, strategy), r in results.items())
    }
    if shared:
        listed = ", ".join(f"{s} {mib:.0f} MiB" for s, mib in shared.items())
        rows += ["", f"Shared memory (/dev/shm) mapped per rank, not in the cells: {listed}."]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {MODELS}")
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help=f"comma-separated, of {STRATEGIES}"
    )
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (s/step: steps 3..N)")
    parser.add_argument("--processes", type=int, default=2, help="processes per distributed run")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose framer_ds and JSONs run")
    parser.add_argument("--label", default="", help="names this measurement in the written table")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--write", type=Path, help="append this table to the strategy_memory section")
    args = parser.parse_args()
    models, strategies = args.models.split(","), args.strategies.split(",")
    code = args.code.resolve()
    with tempfile.TemporaryDirectory(prefix="strategy_memory_") as tmp:
        work = Path(tmp)
        cache = Path(os.environ.get("FRAMER_DS_CACHE", Path.home() / ".cache" / "framer_ds"))
        env = measurement_env(cache, pythonpath=code, env=cpu_counter_env(cache))
        results: dict[tuple[str, str], dict] = {}
        for model in models:
            for strategy in strategies:
                results[model, strategy] = measure(
                    model, strategy, code, work, args.steps, args.processes, env
                )
                r = results[model, strategy]
                print(
                    f"{model:10s} {strategy:14s} run {r['run_mib']:6.0f} MiB  "
                    f"steady {r['steady_mib']:6.0f} MiB  shared {r['shared_mib']:4.0f} MiB  "
                    f"peak {r['peak_mib']:6.0f} MiB  rss {r['rss_mib']:6.0f} MiB  "
                    f"{r['s_per_step']:.3f} s/step  ({r['wall_s']:.0f} s)",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps({f"{m}/{s}": r for (m, s), r in results.items()}, indent=2))
    rows = table(results, models, strategies)
    print("\n".join(rows))
    if args.write is not None:
        write_table(args, rows)


INTRO = f"""{SECTION}

Written by `benchmarks/strategy_memory.py` (its docstring has the method). Cells: peak allocated MiB per
rank above the imports, over the whole run through the last step / over steps 2..N only (start-up
excluded), then s/step (steps 3..N). Largest rank. fp32, `OMP_NUM_THREADS=1` per process. Each `###`
block is one invocation, replaced when the same `--label` runs again."""


def write_table(args: argparse.Namespace, rows: list[str]) -> None:
    """Replace this label's block in the section (or add it); other blocks and sections stay."""
    import re

    from report import write_section

    path = args.write
    text = path.read_text() if path.exists() else ""
    start = text.find(SECTION)
    existing = text[start:].split("\n## ", 1)[0].rstrip("\n") if start >= 0 else INTRO
    heading = f"### {args.label or 'measurement'}"
    blocks = [b for b in re.split(r"(?m)^(?=### )", existing) if b.strip()]
    intro = blocks.pop(0) if blocks and not blocks[0].startswith("### ") else INTRO
    command = "python benchmarks/strategy_memory.py " + shlex.join(sys.argv[1:])
    block = "\n".join([heading, "", f"Command: `{command}`", "", f"Machine: {describe_machine()}", "", *rows])
    kept = [b.rstrip("\n") for b in blocks if b.splitlines()[0] != heading]
    write_section(path, SECTION, "\n\n".join([intro.rstrip("\n"), *kept, block]) + "\n")


if __name__ == "__main__":
    main()
