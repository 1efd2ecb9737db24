"""One `framer-ds` command as data: its parser's texts, its arguments and its handler.

Each command group's module (run, model, data, operations, lab) declares its commands this way and
main.py lists them in the order `framer-ds --help` shows them, so adding a command touches its own
module and one line of that list, and main.py keeps only the wiring and the exit codes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CliCommand:
    """`framer-ds NAME ...`: `add_arguments` fills its parser, `run` does the work and returns the exit
    code. `raw_epilog` keeps the epilog's line breaks (an examples block)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    epilog: str | None = None
    raw_epilog: bool = False

    def register(self, sub: argparse._SubParsersAction) -> None:
        """Add this command's parser to the `framer-ds` subcommands."""
        formatter = argparse.RawDescriptionHelpFormatter if self.raw_epilog else argparse.HelpFormatter
        parser = sub.add_parser(
            self.name,
            help=self.help,
            description=self.description,
            epilog=self.epilog,
            formatter_class=formatter,
        )
        self.add_arguments(parser)
