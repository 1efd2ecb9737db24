"""The commands that read a training YAML to run it: `train` and `validate` (its pre-flight check)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from framer_ds.cli.command import CliCommand
from framer_ds.cli.console import tell, tell_error
from framer_ds.cli.options import add_config_args
from framer_ds.config.errors import ConfigError
from framer_ds.train.preemption import EARLY_STOP

OVERRIDES_HELP = """overrides:
  Any config key can be set after the config path as a dotted key=value; values are read as YAML:
    framer-ds train CONFIG train.length.steps=20 train.optimizer.learning_rate=1e-4 log.wandb=null
    framer-ds train CONFIG model.lora.rank=32 data.source.path=/data/clips train.resume=latest
  Setting one of a set of alternatives replaces the config's choice: data.source.path on a config with
  a data.source.builtin, train.length.steps on one in epochs (of two here, the later wins).
  Every key, with its type, default and description:
    framer-ds config show TASK      (framer-ds tasks lists the tasks)
    docs/config.md                  (the same reference for every built-in task)
  A misspelled key is an error that suggests the key you meant; all problems are listed at once.

distributed:
  accelerate launch --config_file configs/accelerate_4gpu.yaml -m framer_ds train CONFIG
  (--deepspeed_config_file configs/deepspeed/zero3.json swaps the strategy)
"""

# `accelerate launch` flags that `validate` accepts too, so a launch script checks what it will pass.
LAUNCH_FLAGS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def _train_arguments(train: argparse.ArgumentParser) -> None:
    add_config_args(train)
    train.add_argument(
        "--overwrite", action="store_true", help="start over in an output_dir that already holds a run"
    )
    train.add_argument(
        "--deepspeed-config",
        type=Path,
        metavar="JSON",
        help="DeepSpeed JSON when launched by `deepspeed` or `torchrun` (accelerate launch passes "
        "--deepspeed_config_file itself)",
    )


def cmd_train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + (["overwrite_output_dir=true"] if args.overwrite else [])
    if EARLY_STOP.armed:  # before the seconds of imports below: where a stop signal writes its marker
        from framer_ds.config.loader import output_dir_early

        EARLY_STOP.knows(output_dir_early(args.config, overrides))

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.third_party_noise import quiet_loading_bars
    from framer_ds.train.faults import EXIT_PREEMPTED, NonFiniteLossError, Preempted
    from framer_ds.train.loop import run_training

    quiet_loading_bars()
    config = load_run_config(args.config, overrides)
    EARLY_STOP.knows(config.output_dir)  # a stop signal from here on writes preempted.json there
    from framer_ds.launch.environment import remove_accelerate_deepspeed_env, use_deepspeed_json

    if args.deepspeed_config is not None:
        use_deepspeed_json(args.deepspeed_config)
    if os.environ.get("RANK", "0") == "0" and (note := remove_accelerate_deepspeed_env()):
        tell(note)
    try:
        result = run_training(config)
    except Preempted as stop:
        tell(f"{stop}; resume with train.resume=latest (exit {EXIT_PREEMPTED})")
        return EXIT_PREEMPTED
    except NonFiniteLossError as exc:
        tell_error(str(exc))
        return 1
    finally:
        EARLY_STOP.disarm()  # the run has ended: a late signal must not write a marker for it
    if int(os.environ.get("RANK", "0")) == 0:
        summary = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.eval_metrics.items()))
        skipped = f" ({result.skipped_steps} more skipped on overflow)" if result.skipped_steps else ""
        steps = f"{result.global_step} steps{skipped}"
        print(f"done: {steps}, {summary or 'no eval set'}; outputs in {result.output_dir}")
    return 0


def _validate_arguments(validate: argparse.ArgumentParser) -> None:
    add_config_args(validate)
    validate.add_argument("--accelerate-config", type=Path, help="accelerate YAML to cross-check")
    validate.add_argument("--deepspeed-config", type=Path, help="DeepSpeed JSON to cross-check")
    validate.add_argument(
        "--hostfile", type=Path, help="DeepSpeed hostfile of a multi-node launch to cross-check"
    )
    flags = validate.add_argument_group(
        "accelerate launch flags", "the values the launch passes; they beat the accelerate YAML's keys"
    )
    for flag in LAUNCH_FLAGS:
        flags.add_argument(f"--{flag.replace('_', '-')}", dest=flag, metavar="VALUE")


def cmd_validate(args: argparse.Namespace) -> int:
    from framer_ds.config.launch_check import check_launch_configs
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(args.config, args.overrides)
    task = get_task_class(config.task)(config)
    # Numbers stay strings when they are not numbers, so the checks name the bad value.
    launch_flags = {
        flag: int(value) if value.isdigit() else value
        for flag in LAUNCH_FLAGS
        if (value := getattr(args, flag)) is not None
    }
    warnings: list[str] = []
    problems = task.check() + check_launch_configs(
        config.train,
        accelerate_config=args.accelerate_config,
        deepspeed_config=args.deepspeed_config,
        launch_flags=launch_flags,
        warnings=warnings,
        base_precision=config.model.base_precision,
    )
    if args.hostfile is not None or args.accelerate_config is not None:
        from framer_ds.launch.environment import hostfile_launch_problems

        problems += hostfile_launch_problems(args.hostfile, args.accelerate_config, launch_flags)
    if problems:
        raise ConfigError(problems, str(args.config))
    for warning in warnings:
        tell(f"warning: {warning}")
    launch_files = (args.config, args.accelerate_config, args.deepspeed_config, args.hostfile)
    checked = [str(p) for p in launch_files if p is not None]
    print(f"OK: {', '.join(checked)} valid (task {config.task}, output_dir {config.output_dir})")
    return 0


TRAIN = CliCommand(
    "train",
    help="train a task from a YAML config",
    description="Train the task a YAML config names (configs/ has one per task; each starts with the "
    "command that runs it).",
    epilog=OVERRIDES_HELP,
    raw_epilog=True,
    add_arguments=_train_arguments,
    run=cmd_train,
)
VALIDATE = CliCommand(
    "validate",
    help="check a training YAML (and launch configs) without loading weights or data",
    add_arguments=_validate_arguments,
    run=cmd_validate,
)
