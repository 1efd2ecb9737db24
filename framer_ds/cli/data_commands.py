"""`framer-ds data`: `check` (any task's dataset report) and the commands tasks contribute (their
`TaskCommand` declarations in tasks/<task>/commands.py, listed in tasks/registry.py), so the CLI knows
no task's verbs and the Task protocol carries no hook only one task implements."""

from __future__ import annotations

import argparse

from framer_ds.cli.command import CliCommand
from framer_ds.cli.options import add_config_args
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.registry import get_task_class, task_command, task_commands


def _data_arguments(data: argparse.ArgumentParser) -> None:
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    check = data_sub.add_parser("check", help="validate a config's dataset before launch and print a report")
    add_config_args(check)
    for name, declarations in task_commands().items():
        first = next(iter(declarations.values()))  # tasks sharing a name share its help
        add_config_args(data_sub.add_parser(name, help=first.help))


def cmd_data(args: argparse.Namespace) -> int:
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(args.config, args.overrides)
    command = None if args.data_command == "check" else task_command(args.data_command, config.task)
    task = get_task_class(config.task)(config)
    problems = task.check()
    if problems:
        raise ConfigError(problems, str(args.config))
    if command is not None:
        from framer_ds.launch.environment import process_shard

        print(command.run(task, process_shard()))
        return 0
    task.prepare_data()
    print(task.data_report())
    return 0


DATA = CliCommand("data", help="dataset tools", add_arguments=_data_arguments, run=cmd_data)
