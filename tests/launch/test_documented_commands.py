"""Every `deepspeed` command line the README and docs/ show parses with DeepSpeed's own launcher parser,
and names framer_ds as the module it runs. DeepSpeed takes `--module`; the README's `-m framer_ds` was
refused (`deepspeed: error: unrecognized arguments: -m`), found on a real cluster (issue 49, finding 6;
tests/launch/test_cluster.py runs `deepspeed --hostfile ... --module framer_ds` there)."""

from __future__ import annotations

import re
import shlex

import pytest

from conftest import REPO


def documented_deepspeed_commands() -> list[tuple[str, str]]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", path.read_text())  # backslash continuations joined
        for line in text.splitlines():
            command = line.split(" #")[0].strip()
            if command.startswith("deepspeed "):
                found.append((path.name, command))
    return found


@pytest.mark.parametrize("where,command", documented_deepspeed_commands())
def test_documented_deepspeed_commands_parse(where, command):
    from deepspeed.launcher.runner import parse_args

    args = parse_args(shlex.split(command)[1:])
    assert args.module and args.user_script == "framer_ds", f"{where}: {command}"


def test_the_docs_show_deepspeed_commands():
    assert {where for where, _ in documented_deepspeed_commands()} >= {"README.md", "cluster.md"}
