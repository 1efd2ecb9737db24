"""Config problems are collected, never raised one at a time: a user fixes a YAML once, not N times."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config: where (a dotted key path or a file), what, and how to fix it."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class ConfigError(Exception):
    """Raised with every problem found, so the CLI can print them all and exit 1."""

    def __init__(self, problems: Iterable[ConfigProblem], source: str = "config"):
        self.problems = list(problems)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{len(self.problems)} problem(s) in {self.source}:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class RunSetupError(RuntimeError):
    """The run cannot start where and how it was launched (its directory is in use, not shared by every
    node): the message names the problem and the fix; the CLI prints it and exits 1."""


class InputDataError(RuntimeError):
    """A data file that cannot be used (corrupt, unreadable) found during training: the message names
    the file and the fix; the CLI prints it and exits 1 instead of a bare traceback."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' Did you mean ...?' suffix for a misspelled key or name, or '' when nothing is close."""
    choices = list(choices)
    matches = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    # A truncated name ("pretrained" for "pretrained_model_name_or_path") is too short for difflib.
    matches += [c for c in choices if len(word) >= 3 and word in c and c not in matches]
    matches = matches[:3]
    if not matches:
        return ""
    return " Did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"
