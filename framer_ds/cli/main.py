"""`framer-ds` subcommands. Config problems print as a list and exit 1; crashes still exit non-zero.

This module wires the commands (each group's module declares its own: run_commands, data_commands,
model_commands, operation_commands, lab_commands) and maps the errors to exit codes."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from framer_ds.cli import model_commands, operation_commands, run_commands
from framer_ds.cli.command import CliCommand
from framer_ds.cli.console import tell, tell_error
from framer_ds.cli.data_commands import DATA
from framer_ds.cli.lab_commands import LAB_COMMANDS
from framer_ds.cli.process_exit import leave
from framer_ds.compat import MissingDependencyError, check_torchvision
from framer_ds.config.errors import ConfigError, InputDataError, RunSetupError
from framer_ds.launch.network import pin_gloo_interface
from framer_ds.storage.disk_space import DiskFullError, full_disk_line
from framer_ds.third_party_noise import quiet_third_party_noise
from framer_ds.train.preemption import EARLY_STOP

# In the order `framer-ds --help` lists them.
COMMANDS: tuple[CliCommand, ...] = (
    run_commands.TRAIN,
    run_commands.VALIDATE,
    DATA,
    model_commands.SAMPLE,
    operation_commands.CONFIG,
    model_commands.EXPORT,
    model_commands.EVAL,
    operation_commands.CHECKPOINT,
    operation_commands.ENV,
    operation_commands.HOSTS,
    *LAB_COMMANDS,
    operation_commands.TASKS,
)


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
    for command in COMMANDS:
        command.register(sub)
    return parser


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
    # Before any process group exists: a node whose name resolves to loopback gets gloo's interface set.
    network_note = pin_gloo_interface()
    if network_note and os.environ.get("LOCAL_RANK", "0") == "0":
        tell(network_note)
    if args.command != "train":
        EARLY_STOP.resend_pending()  # only a training run stops with exit 75 (train/preemption.py)
    handlers = {command.name: command.run for command in COMMANDS}
    args.run_command = main  # `framer-ds smoke` runs other commands in this process, with their exit codes
    try:
        check_torchvision()
        return handlers[args.command](args)
    except ConfigError as exc:
        tell_error(exc.render())
        return 1
    except (InputDataError, RunSetupError, MissingDependencyError, DiskFullError) as exc:
        tell_error(str(exc))
        return 1
    except Exception as exc:  # a full disk where no writer said more is one line too; the rest is raised
        line = full_disk_line(exc)
        if line is None:
            raise
        tell_error(line)
        return 1


def run() -> None:
    """The `framer-ds` console script: `main`, then leave the process (cli/process_exit.py: a launched
    rank skips the interpreter's teardown, where gloo's threads could abort a finished run)."""
    leave(main())


if __name__ == "__main__":
    run()
