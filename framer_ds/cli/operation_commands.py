"""The commands around a run rather than in it: `config` (the reference and resolved values), `checkpoint`
(ZeRO -> universal), `env` (machine report and rendezvous smoke test), `hosts` (a hostfile's hosts) and
`tasks` (the registered tasks)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from framer_ds.cli.command import CliCommand
from framer_ds.cli.console import tell_error
from framer_ds.cli.options import add_config_args
from framer_ds.config.errors import ConfigError, ConfigProblem


def _config_arguments(config: argparse.ArgumentParser) -> None:
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


def _checkpoint_arguments(checkpoint: argparse.ArgumentParser) -> None:
    checkpoint_sub = checkpoint.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    universal = checkpoint_sub.add_parser(
        "universal",
        help="convert a ZeRO checkpoint so it resumes at any number of processes",
        description="Convert output_dir/checkpoints/step_N (a DeepSpeed ZeRO checkpoint) to DeepSpeed's "
        "universal format in step_N/universal ahead of time. A resume at another world size converts on "
        "its own; do it here when the conversion of a large model would outlast the collective timeout.",
    )
    universal.add_argument("checkpoint", type=Path, help="output_dir/checkpoints/step_N")


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


def _env_arguments(env: argparse.ArgumentParser) -> None:
    env.add_argument("--json", action="store_true", help="one JSON object instead of text")
    env.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for every rank (default 60)"
    )
    env.add_argument("--output-dir", type=Path, help="report the free disk there (default: here)")


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


def _hosts_arguments(hosts: argparse.ArgumentParser) -> None:
    hosts.add_argument("hostfile", type=Path)
    hosts.add_argument("--include", help="DeepSpeed's filter, e.g. node-a@node-b:0,1")
    hosts.add_argument("--exclude", help="DeepSpeed's filter, e.g. node-c")
    hosts.add_argument(
        "--num-gpus", type=int, help="keep the first N slots of each host (deepspeed --num_gpus)"
    )
    hosts.add_argument(
        "--same-slots", action="store_true", help="fail unless every host runs the same number (accelerate)"
    )


def cmd_hosts(args: argparse.Namespace) -> int:
    from framer_ds.launch.hostfile import load_hosts

    hosts = load_hosts(args.hostfile, args.include, args.exclude, args.num_gpus, args.same_slots)
    for rank, host in enumerate(hosts):
        print(rank, host.name, ",".join(map(str, host.slots)))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from framer_ds.tasks.registry import available_tasks

    tasks = available_tasks()
    width = max(map(len, tasks), default=0)
    for name, summary in tasks.items():
        print(f"{name:<{width}}  {summary}")
    return 0


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """`framer-ds tasks` takes none."""


CONFIG = CliCommand(
    "config",
    help="every config key: its type, default and description",
    add_arguments=_config_arguments,
    run=cmd_config,
)
CHECKPOINT = CliCommand(
    "checkpoint", help="checkpoint tools", add_arguments=_checkpoint_arguments, run=cmd_checkpoint
)
ENV = CliCommand(
    "env",
    help="versions, devices and limits; under a launcher also a rendezvous smoke test over all ranks",
    description="Report this machine (versions, GPUs, ulimit -l, free disk, accelerate's default "
    "config). Run under the launcher a job will use (accelerate launch / torchrun / deepspeed / srun) "
    "to also check that every rank reaches every other: all-reduce, a 64 MiB broadcast and its "
    "bandwidth, one line per rank; a failure exits non-zero with the backend's error and a hint.",
    add_arguments=_env_arguments,
    run=cmd_env,
)
HOSTS = CliCommand(
    "hosts",
    help="the hosts a DeepSpeed hostfile gives, one per line: MACHINE_RANK HOST SLOTS",
    add_arguments=_hosts_arguments,
    run=cmd_hosts,
)
TASKS = CliCommand("tasks", help="list registered tasks", add_arguments=_no_arguments, run=cmd_tasks)
