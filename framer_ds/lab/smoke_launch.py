"""The strategy a shipped recipe launches (its header's first line), and how `framer-ds smoke` runs that
strategy on this CPU machine.

Why from the header: it is the command the user will queue (tests/config/test_shipped_configs.py checks
it parses and names existing files). A DeepSpeed recipe (its JSON by `--deepspeed_config_file`, else the
accelerate YAML's) runs that JSON on 2 CPU processes over gloo (configs/accelerate_cpu_2proc.yaml); an
FSDP2 one on configs/accelerate_fsdp2_cpu_2proc.yaml; a `--multi_gpu` (DDP) one as DDP on 2 CPU processes;
a `framer-ds train` one (or one process) in this process. accelerate's own parser reads the line, so a
flag it does not know fails here as it would on the cluster.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.lab.bench import launch_args

PROCESSES = 2
"""Processes of a distributed recipe's smoke: the fewest that shard, reduce and gather for real."""


@dataclass(frozen=True)
class RecipeLaunch:
    strategy: str
    """"plain" (one process), "ddp", "fsdp2", or a DeepSpeed JSON's name ("zero2", "zero3_offload")."""
    header: str | None
    """The recipe's launch line, as written."""
    deepspeed_json: Path | None = None

    @property
    def distributed(self) -> bool:
        return self.strategy != "plain"

    def cpu_launch_args(self, repo: Path) -> list[str]:
        """`accelerate launch` flags that run this strategy on PROCESSES CPU processes (repo: where
        configs/ is)."""
        json_dir = (
            self.deepspeed_json.parent if self.deepspeed_json is not None else repo / "configs/deepspeed"
        )
        return launch_args(self.strategy, PROCESSES, json_dir, gpu=False, accelerate_dir=repo / "configs")

    def describe(self, repo: Path) -> str:
        if not self.distributed:
            return "one process (as the recipe launches), in this process"
        flags = " ".join(_relative(arg, repo) for arg in self.cpu_launch_args(repo))
        return f"{self.strategy} on {PROCESSES} CPU processes over gloo (accelerate launch {flags})"


def _relative(arg: str, repo: Path) -> str:
    path = Path(arg)
    return str(path.relative_to(repo)) if path.is_absolute() and path.is_relative_to(repo) else arg


def repo_root(config_path: Path) -> Path:
    """The folder holding configs/ (the header's paths are relative to it): an ancestor of the recipe,
    else the working directory."""
    for folder in Path(config_path).resolve().parents:
        if (folder / "configs" / "deepspeed").is_dir():
            return folder
    return Path.cwd()


def recipe_launch(config_path: Path) -> RecipeLaunch:
    """The strategy of the recipe's first line (module docstring); a config without a launch header is
    one process."""
    lines = Path(config_path).read_text().splitlines()
    header = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    tokens = shlex.split(header)
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens.pop(0)
    if tokens[:2] != ["accelerate", "launch"]:
        return RecipeLaunch("plain", header or None)
    from accelerate.commands.launch import launch_command_parser

    repo = repo_root(config_path)
    try:
        args = launch_command_parser().parse_args(tokens[2:])
    except SystemExit:
        problem = f"its first line is not a command `accelerate launch` parses: {header}"
        raise ConfigError([ConfigProblem("header", problem)], str(config_path)) from None
    settings = yaml.safe_load((repo / args.config_file).read_text()) if args.config_file else {}
    kind = str(settings.get("distributed_type", "NO"))
    json_name = args.deepspeed_config_file or (settings.get("deepspeed_config") or {}).get(
        "deepspeed_config_file"
    )
    if kind == "DEEPSPEED" or args.use_deepspeed or args.deepspeed_config_file:
        json_path = repo / json_name
        return RecipeLaunch(json_path.stem, header, json_path)
    if kind == "FSDP" or args.use_fsdp:
        return RecipeLaunch("fsdp2", header)
    processes = args.num_processes or settings.get("num_processes") or 1
    multi = args.multi_gpu or kind == "MULTI_GPU" or int(processes) * int(args.num_machines or 1) > 1
    return RecipeLaunch("ddp" if multi else "plain", header)
