"""`framer-ds` subcommands. Config problems print as a list and exit 1; crashes still exit non-zero."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from framer_ds.cli.console import tell, tell_error
from framer_ds.cli.lab_commands import LAB_COMMANDS, add_lab_commands
from framer_ds.cli.options import add_config_args
from framer_ds.compat import MissingDependencyError, check_torchvision
from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError, RunSetupError
from framer_ds.storage.disk_space import DiskFullError
from framer_ds.third_party_noise import quiet_third_party_noise
from framer_ds.train.preemption import EARLY_STOP

OVERRIDES_HELP = """overrides:
  Any config key can be set after the config path as a dotted key=value; values are read as YAML:
    framer-ds train CONFIG train.max_steps=20 train.learning_rate=1e-4 log.wandb=null
    framer-ds train CONFIG model.lora.rank=32 data.root=/data/clips train.resume=latest
  Every key, with its type, default and description:
    framer-ds config show TASK      (framer-ds tasks lists the tasks)
    docs/config.md                  (the same reference for every built-in task)
  A misspelled key is an error that suggests the key you meant; all problems are listed at once.

distributed:
  accelerate launch --config_file configs/accelerate_4gpu.yaml -m framer_ds train CONFIG
  (--deepspeed_config_file configs/deepspeed/zero3.json swaps the strategy)
"""


def _add_export_args(parser: argparse.ArgumentParser) -> None:
    """`sample` and `export` read an export; its recorded task parses the rest."""
    parser.add_argument("export_dir", type=Path, help="a run's final/ (or checkpoints/step_N/adapter/)")
    parser.add_argument(
        "task_options", nargs=argparse.REMAINDER, metavar="...", help="the options of the export's task"
    )


# `accelerate launch` flags that `validate` accepts too, so a launch script checks what it will pass.
LAUNCH_FLAGS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framer-ds",
        allow_abbrev=False,
        description="Fine-tune video-diffusion LoRAs, ViTs and TTS LMs with Accelerate + DeepSpeed.",
        epilog="Distributed: accelerate launch --config_file configs/accelerate_4gpu.yaml "
        "-m framer_ds train CONFIG",
    )
    # DeepSpeed's launcher passes --local_rank=N before the command; the rank is in the environment too.
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train a task from a YAML config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the task a YAML config names (configs/ has one per task; each starts with the "
        "command that runs it).",
        epilog=OVERRIDES_HELP,
    )
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

    validate = sub.add_parser(
        "validate", help="check a training YAML (and launch configs) without loading weights or data"
    )
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

    data = sub.add_parser("data", help="dataset tools")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    check = data_sub.add_parser("check", help="validate a config's dataset before launch and print a report")
    add_config_args(check)
    encode = data_sub.add_parser(
        "encode-audio",
        help="encode a config's audio files with its codec into the cache training reads (resumable)",
    )
    add_config_args(encode)
    tracks = data_sub.add_parser(
        "tracks",
        help="precompute point tracks of a config's videos (data.tracks) for Framer's trajectory branch; "
        "under `accelerate launch -m framer_ds data tracks ...` every process tracks its share",
    )
    add_config_args(tracks)

    sample = sub.add_parser(
        "sample",
        help="generate from a trained model: the task that made it decides what (video, labels, ...)",
        description="Generate from an export (a run's final/, or a checkpoint's export such as "
        "step_N/adapter/). The task recorded in it decides the options: run "
        "`framer-ds sample RUN/final --help` to list them.",
    )
    _add_export_args(sample)

    config = sub.add_parser("config", help="every config key: its type, default and description")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show = config_sub.add_parser("show", help="print every key of a task's config")
    show.add_argument("task", help="a registered task (`framer-ds tasks` lists them)")
    get = config_sub.add_parser(
        "get", help="one resolved value of a training YAML (with overrides), e.g. for a launch script"
    )
    get.add_argument("key", help="dotted key, e.g. output_dir or train.micro_batch_size")
    add_config_args(get)
    docs = config_sub.add_parser("docs", help="the config reference of every built-in task, as markdown")
    docs.add_argument("--write", type=Path, metavar="PATH", help="write it to PATH (docs/config.md)")

    export = sub.add_parser(
        "export",
        help="write another form of a trained model (e.g. a video_lora adapter merged into SVD)",
        description="Write another form of an export (a run's final/): the task recorded in it decides "
        "what; run `framer-ds export RUN/final --help` to list its options.",
    )
    _add_export_args(export)

    evaluation = sub.add_parser(
        "eval",
        help="evaluate a finished run's export on its held-out data (writes RUN/eval.json)",
        description="Evaluate RUN/final (or RUN/best) with the config recorded in it, on the run's own "
        "held-out data, exactly as training evaluates: vit_classification loss, accuracy and per-class "
        "accuracy; tts_lm loss and audio-token accuracy; drivable_vit IoU per class and mean; video_lora "
        "eval/loss (with model.interp_eval the interpolation metrics). Prints the metrics and writes "
        "RUN/eval.json (RUN/eval_best.json), with a per_class table where the task has classes. Under "
        "`accelerate launch --num_processes N -m framer_ds eval RUN` the held-out set is split between "
        "the processes and the numbers are those of one process.",
    )
    evaluation.add_argument("run_dir", type=Path, help="a finished run's output_dir")
    evaluation.add_argument("--export", choices=["final", "best"], default="final", help="which export")
    evaluation.add_argument("--max-batches", type=int, default=None, help="stop after N eval batches")

    checkpoint = sub.add_parser("checkpoint", help="checkpoint tools")
    checkpoint_sub = checkpoint.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    universal = checkpoint_sub.add_parser(
        "universal",
        help="convert a ZeRO checkpoint so it resumes at any number of processes",
        description="Convert output_dir/checkpoints/step_N (a DeepSpeed ZeRO checkpoint) to DeepSpeed's "
        "universal format in step_N/universal ahead of time. A resume at another world size converts on "
        "its own; do it here when the conversion of a large model would outlast the collective timeout.",
    )
    universal.add_argument("checkpoint", type=Path, help="output_dir/checkpoints/step_N")

    env = sub.add_parser(
        "env",
        help="versions, devices and limits; under a launcher also a rendezvous smoke test over all ranks",
        description="Report this machine (versions, GPUs, ulimit -l, free disk, accelerate's default "
        "config). Run under the launcher a job will use (accelerate launch / torchrun / deepspeed / srun) "
        "to also check that every rank reaches every other: all-reduce, a 64 MiB broadcast and its "
        "bandwidth, one line per rank; a failure exits non-zero with the backend's error and a hint.",
    )
    env.add_argument("--json", action="store_true", help="one JSON object instead of text")
    env.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for every rank (default 60)"
    )
    env.add_argument("--output-dir", type=Path, help="report the free disk there (default: here)")

    hosts = sub.add_parser(
        "hosts", help="the hosts a DeepSpeed hostfile gives, one per line: MACHINE_RANK HOST SLOTS"
    )
    hosts.add_argument("hostfile", type=Path)
    hosts.add_argument("--include", help="DeepSpeed's filter, e.g. node-a@node-b:0,1")
    hosts.add_argument("--exclude", help="DeepSpeed's filter, e.g. node-c")
    hosts.add_argument(
        "--num-gpus", type=int, help="keep the first N slots of each host (deepspeed --num_gpus)"
    )
    hosts.add_argument(
        "--same-slots", action="store_true", help="fail unless every host runs the same number (accelerate)"
    )

    add_lab_commands(sub)

    sub.add_parser("tasks", help="list registered tasks")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + (["overwrite_output_dir=true"] if args.overwrite else [])
    if EARLY_STOP.armed:  # before the seconds of imports below: where a stop signal writes its marker
        from framer_ds.config.loader import output_dir_early

        EARLY_STOP.knows(output_dir_early(args.config, overrides))

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train.faults import EXIT_PREEMPTED, NonFiniteLossError, Preempted
    from framer_ds.train.loop import run_training

    config = load_run_config(args.config, overrides)
    EARLY_STOP.knows(config.output_dir)  # a stop signal from here on writes preempted.json there
    if args.deepspeed_config is not None:
        from framer_ds.launch.environment import use_deepspeed_json

        use_deepspeed_json(args.deepspeed_config)
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
        print(f"done: {result.global_step} steps, {summary or 'no eval set'}; outputs in {result.output_dir}")
    return 0


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


def cmd_data(args: argparse.Namespace) -> int:
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(args.config, args.overrides)
    task = get_task_class(config.task)(config)
    problems = task.check()
    if problems:
        raise ConfigError(problems, str(args.config))
    if args.data_command == "encode-audio":
        print(task.encode_data())
        return 0
    if args.data_command == "tracks":
        from framer_ds.launch.environment import process_shard

        print(task.compute_tracks(process_shard()))  # needs only the videos, not prepare_data's scores
        return 0
    task.prepare_data()
    print(task.data_report())
    return 0


def _task_command(args: argparse.Namespace, command: str) -> int:
    """`framer-ds sample|export EXPORT_DIR [task options]`: the task recorded in the export supplies the
    options model (its fields become the flags) and does the work."""
    from framer_ds.cli.options import build_options_parser, parse_options
    from framer_ds.tasks.run_config import load_exported_task

    task = load_exported_task(args.export_dir)
    options_model = type(task).sample_options if command == "sample" else type(task).export_options
    if options_model is None:
        return _print(task.export_command(args.export_dir, None))
    parser = build_options_parser(
        options_model,
        prog=f"framer-ds {command} {args.export_dir}",
        description=f"{task.name}: {options_model.__doc__ or ''}".strip(),
    )
    options = parse_options(options_model, parser, args.task_options)
    run = task.sample if command == "sample" else task.export_command
    return _print(run(args.export_dir, options))


def _print(text: str) -> int:
    print(text)
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    return _task_command(args, "sample")


def cmd_export(args: argparse.Namespace) -> int:
    return _task_command(args, "export")


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from framer_ds.train.evaluate_export import eval_output_path, evaluate_run

    report = evaluate_run(args.run_dir, args.export, args.max_batches)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(report["metrics"], indent=2))
        print(f"wrote {eval_output_path(args.run_dir, args.export)}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from framer_ds.config.reference import render_text
    from framer_ds.storage.atomic import atomic_write_text
    from framer_ds.tasks.config_docs import config_docs_markdown, task_reference
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config, resolved_value

    if args.config_command == "show":
        get_task_class(args.task)  # an unknown task gets the registry's "did you mean"
        print(render_text(task_reference(args.task)), end="")
    elif args.config_command == "get":
        print(resolved_value(load_run_config(args.config, args.overrides), args.key))
    elif args.write is not None:
        atomic_write_text(args.write, config_docs_markdown())
        print(f"wrote {args.write}")
    else:
        print(config_docs_markdown(), end="")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    import json

    from framer_ds.launch.env_report import format_machine_report, machine_report
    from framer_ds.launch.smoke import SmokeTestFailed, format_smoke_test, launched, run_smoke_test

    report: dict = {"machine": machine_report(args.output_dir)}
    rank = int(os.environ.get("RANK", "0"))
    if launched():
        try:
            report["distributed"] = run_smoke_test(args.timeout)
        except SmokeTestFailed as exc:
            tell_error(str(exc))
            return 1
    if rank == 0:
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(format_machine_report(report["machine"]))
            if "distributed" in report:
                print(format_smoke_test(report["distributed"]))
            else:
                print(
                    "distributed: not launched (to test it: run under accelerate launch, torchrun, "
                    "deepspeed or srun)"
                )
    return 0


def cmd_hosts(args: argparse.Namespace) -> int:
    from framer_ds.launch.hostfile import load_hosts

    hosts = load_hosts(args.hostfile, args.include, args.exclude, args.num_gpus, args.same_slots)
    for rank, host in enumerate(hosts):
        print(rank, host.name, ",".join(map(str, host.slots)))
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from framer_ds.engine.resume.universal import (
        UNIVERSAL_DIR,
        convert_to_universal,
        is_universal,
        zero_shard_count,
    )

    checkpoint = args.checkpoint
    if not zero_shard_count(checkpoint):
        raise ConfigError(
            [
                ConfigProblem(
                    str(checkpoint), "not a DeepSpeed ZeRO checkpoint (no pytorch_model/*optim_states.pt)"
                )
            ],
            "checkpoint universal",
        )
    if is_universal(checkpoint / UNIVERSAL_DIR):
        print(f"{checkpoint / UNIVERSAL_DIR} already exists")
        return 0
    print(f"wrote {convert_to_universal(checkpoint)}")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from framer_ds.tasks.registry import available_tasks

    tasks = available_tasks()
    width = max(map(len, tasks), default=0)
    for name, summary in tasks.items():
        print(f"{name:<{width}}  {summary}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "validate": cmd_validate,
    "data": cmd_data,
    "sample": cmd_sample,
    "export": cmd_export,
    "eval": cmd_eval,
    "config": cmd_config,
    "env": cmd_env,
    "hosts": cmd_hosts,
    "checkpoint": cmd_checkpoint,
    **LAB_COMMANDS,
    "tasks": cmd_tasks,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Options may sit between overrides (`train CFG a=1 --overwrite b=2`); argparse's nargs="*" stops
    # at the first option, so the remaining key=value items arrive as "unknown" and are taken here.
    args, extra = parser.parse_known_args(argv)
    if args.command in ("sample", "export"):  # everything after the export directory belongs to its task
        args.task_options = [*args.task_options, *extra]
        extra = []
    stray = [item for item in extra if item.startswith("-") or "=" not in item]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    quiet_third_party_noise()
    if args.command != "train":
        EARLY_STOP.resend_pending()  # only a training run stops with exit 75 (train/preemption.py)
    try:
        check_torchvision()
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        tell_error(exc.render())
        return 1
    except (InputDataError, RunSetupError, MissingDependencyError, DiskFullError) as exc:
        tell_error(str(exc))
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
