"""How close `framer-ds plan`'s per-rank prediction is to the measured peak, per model and strategy.

Why: the planner is only worth its answer if its numbers hold; the target is within 15%. Each cell runs
the same training as `benchmarks/strategy_memory.py` (its models, configs and instrument,
framer_ds/lab/measure.py: peak allocated bytes above the imports, largest rank, over steps 2..N; start-up
is listed beside, not compared) and puts beside it what the planner predicts for that config file,
strategy and process count: the census, the activation probe at the run's micro-batch, the shipped JSON's
buffers resolved as the engine resolves them, added up by framer_ds/lab/memory_model.py. On a CPU the
offloaded terms live in the same memory as the rest, so a CPU cell compares the measured peak with device
+ host together; on a GPU (`torch.cuda.max_memory_allocated`) with the device terms only. The figure
compared is tensor bytes: on a GPU `max_memory_allocated`, on a CPU the allocation counter's tensor count
(CPU tensor storage, which c10 allocates, and mapped weight files), the same quantity. The counter's
whole-process figure (Python objects, gloo and DeepSpeed host structures, video decoding as well) is
listed beside for information.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from strategy_memory import REPO, measure

from framer_ds.lab.activations import probe_activations
from framer_ds.lab.census import helper_modules, meta_model, task_census
from framer_ds.lab.hardware import Hardware
from framer_ds.lab.memory_model import estimate
from framer_ds.lab.plan_rows import resolved_zero
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

SECTION = "## planner_accuracy"
TARGET = 0.15
MODELS = ("vit_85m", "unet_lora", "tiny_lora")
STRATEGIES = ("plain", "ddp", "zero2", "zero3", "zero2_offload", "zero3_offload")


def predict(config_path: Path, strategy: str, processes: int) -> int:
    """What the planner says one rank allocates for this config, strategy and process count."""
    import torch

    config = load_run_config(config_path)
    task = get_task_class(config.task)(config)
    model = meta_model(task)
    helpers = helper_modules(task)
    census = task_census(task, model, helpers)
    probe = probe_activations(task, model=model, helpers=helpers.in_evaluation)
    world = 1 if strategy == "plain" else processes
    hardware = Hardware(world, 1, 0)
    zero = resolved_zero(
        "ddp" if strategy == "plain" else strategy, census, REPO / "configs/deepspeed", hardware
    )
    found = estimate(
        "ddp" if strategy == "plain" else strategy,
        census,
        world,
        config.train.mixed_precision,
        probe.at(config.train.micro_batch_size),
        zero,
        probe.eval_transient,
    )
    return found.peak("device" if torch.cuda.is_available() else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--write", type=Path, help="replace the planner_accuracy section of this file")
    args = parser.parse_args()
    from alloc_counter.alloc_counter import cpu_counter_env

    from framer_ds.lab.measure import describe_machine, measurement_env
    from framer_ds.storage.locations import default_cache_dir

    rows = [
        "| model | strategy | predicted MiB | measured tensor MiB, steps 2..N | error | "
        "tensor MiB, start-up included | whole process MiB, steps 2..N |",
        "|---|---|---|---|---|---|---|",
    ]
    errors = []
    with tempfile.TemporaryDirectory(prefix="planner_accuracy_") as tmp:
        work = Path(tmp)
        env = measurement_env(default_cache_dir(), pythonpath=REPO, env=cpu_counter_env(default_cache_dir()))
        for model in args.models.split(","):
            for strategy in args.strategies.split(","):
                measured = measure(model, strategy, REPO, work, args.steps, args.processes, env)
                config_path = work / f"{model}_{strategy}" / "config.yaml"  # what measure() trained
                predicted = predict(config_path, strategy, args.processes) / 2**20
                steady = measured["tensor_steady_mib"]
                error = (predicted - steady) / steady
                errors.append(abs(error))
                rows.append(
                    f"| {model} | {strategy} | {predicted:.0f} | {steady:.0f} | {error:+.1%} | "
                    f"{measured['tensor_run_mib']:.0f} | {measured['steady_mib']:.0f} |"
                )
                print(rows[-1], flush=True)
    within = sum(e <= TARGET for e in errors)
    summary = f"{within} of {len(errors)} cells within {TARGET:.0%}; largest error {max(errors):.1%}."
    print(summary)
    if args.write is not None:
        from report import write_section

        command = "python " + shlex.join(sys.argv)  # as typed, from wherever it ran
        method = __doc__.split("\n\n")[1].replace("\n", " ").strip()
        parts = [
            SECTION,
            method,
            f"Command: `{command}`",
            f"Machine: {describe_machine()}",
            "\n".join(rows),
            summary,
        ]
        text = "\n\n".join(parts)
        write_section(args.write, SECTION, text + "\n")


if __name__ == "__main__":
    main()
