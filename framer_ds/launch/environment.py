"""What a launch brings with it: DeepSpeed without accelerate's CLI, accelerate's `.deepspeed_env`, and a
hostfile checked against the accelerate YAML."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framer_ds.config.accelerate_yaml_rules import uses_deepspeed_runner
from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.launch_files import load_yaml_file
from framer_ds.launch.hostfile import hostfile_problems

# accelerate's hostfile launch (configs/accelerate_hostfile.yaml: DeepSpeed's pdsh runner) appends the
# launcher's whole environment to ./.deepspeed_env, which DeepSpeed's runner exports on every node's
# pdsh command line, and leaves it there: see `remove_accelerate_deepspeed_env`.
DEEPSPEED_ENV_FILE = Path(".deepspeed_env")
_ACCELERATE_MARK = "ACCELERATE_USE_DEEPSPEED="
_SECRET_NAME_PARTS = ("API_KEY", "TOKEN", "SECRET", "PASSWORD")


def _accelerate_deepspeed_env() -> list[str] | None:
    """The variable names in ./.deepspeed_env when accelerate wrote it (it sets ACCELERATE_USE_DEEPSPEED;
    a file a user wrote for DeepSpeed's runner does not), else None."""
    try:
        lines = DEEPSPEED_ENV_FILE.read_text(errors="replace").splitlines()
    except OSError:
        return None
    if not any(line.startswith(_ACCELERATE_MARK) for line in lines):
        return None
    return sorted({line.split("=", 1)[0] for line in lines if "=" in line})


def remove_accelerate_deepspeed_env() -> str | None:
    """Delete accelerate's ./.deepspeed_env once the ranks it launched run (DeepSpeed's runner read it
    before it started them); returns the line to tell, or None.

    Why: left behind, it breaks the next `deepspeed --hostfile` in the same checkout (its
    ACCELERATE_USE_DEEPSPEED reaches every rank, which then refuses --deepspeed-config), and it holds the
    launcher's whole environment, tokens included, which DeepSpeed's runner puts on every node's pdsh
    command line (readable with `ps` there)."""
    # Only a run that came through that file: DeepSpeed's launcher (it sets CROSS_RANK) with accelerate's
    # environment. Another run in the same checkout (a Slurm job, say) must not take the file away
    # before DeepSpeed's runner has read it.
    launched_by_it = "CROSS_RANK" in os.environ and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
    names = _accelerate_deepspeed_env() if launched_by_it else None
    if names is None:
        return None
    DEEPSPEED_ENV_FILE.unlink(missing_ok=True)
    secrets = [n for n in names if any(part in n.upper() for part in _SECRET_NAME_PARTS)]
    carried = (
        f"; it carried {', '.join(secrets)} to every node's pdsh command line (visible to `ps` there): "
        "use `wandb login` / `huggingface-cli login` (files in the shared home) instead of exporting tokens"
        if secrets
        else ""
    )
    return (
        f"removed ./{DEEPSPEED_ENV_FILE}, the launcher's environment accelerate wrote for DeepSpeed's "
        f"runner (left behind, it breaks a later `deepspeed --hostfile` here){carried}"
    )


def process_shard() -> tuple[int, int]:
    """(rank, world size) of this process under any launcher (accelerate, torchrun, deepspeed and srun via
    our scripts set RANK and WORLD_SIZE), else (0, 1): how a data command started on every GPU splits
    its work without a process group."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def use_deepspeed_json(path: Path) -> None:
    """`deepspeed --num_gpus N --module framer_ds train CONFIG --deepspeed-config Z.json` and the same
    under torchrun: set what `accelerate launch --deepspeed_config_file Z.json` sets, so the Accelerator
    builds the same DeepSpeed plugin from the environment, and the same runtime checks read the JSON.
    Called once, before the Accelerator exists."""
    path = Path(path)
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        given = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "the accelerate YAML's")
        msg = (
            f"accelerate launch already passes a DeepSpeed config ({given}); drop --deepspeed-config "
            "and use accelerate's --deepspeed_config_file to swap it"
        )
        if _accelerate_deepspeed_env() is not None:  # accelerate's leftover file, exported by DeepSpeed
            msg = (
                f"./{DEEPSPEED_ENV_FILE}, left here by an earlier `accelerate launch` with a hostfile, set "
                f"ACCELERATE_USE_DEEPSPEED (DeepSpeed's runner exports that file to every node): delete it "
                f"(rm {DEEPSPEED_ENV_FILE}) and launch again"
            )
        raise ConfigError([ConfigProblem("--deepspeed-config", msg)], "launch")
    if not path.is_file():
        raise ConfigError(
            [ConfigProblem("--deepspeed-config", f"{path} not found; check the path")], "launch"
        )
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(path)


def hostfile_launch_problems(
    hostfile: Path | None, accelerate_config: Path | None, launch_flags: Mapping[str, Any] | None = None
) -> list[ConfigProblem]:
    """The hostfile of a launch (given, or the accelerate YAML's `deepspeed_hostfile` when accelerate hands
    the job to DeepSpeed's runner) and the process and machine counts against it."""
    acc: dict[str, Any] = {}
    if accelerate_config is not None:
        loaded, _ = load_yaml_file(accelerate_config)  # its own problems are reported by the YAML checks
        acc = {**(loaded or {}), **(launch_flags or {})}
    if hostfile is None and acc and uses_deepspeed_runner(acc):
        section = acc.get("deepspeed_config") or {}
        named = section.get("deepspeed_hostfile")
        if not named:
            launcher = section.get("deepspeed_multinode_launcher", "unset (= pdsh)")
            where = f"{accelerate_config}: deepspeed_config.deepspeed_hostfile"
            msg = (
                "is missing: with several machines and deepspeed_multinode_launcher "
                f"{launcher}, "
                "accelerate hands the launch to DeepSpeed's runner, which reads the hosts from it; name a "
                "hostfile (configs/accelerate_hostfile.yaml), or set deepspeed_multinode_launcher: standard "
                "and start one launch per node (configs/accelerate_multinode.yaml)"
            )
            return [ConfigProblem(where, msg)]
        hostfile = Path(named)
    if hostfile is None:
        return []
    counts = [acc.get(key) for key in ("num_processes", "num_machines")]
    counts = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in counts]
    section = acc.get("deepspeed_config") or {}
    filters = [section.get(f"deepspeed_{kind}_filter") for kind in ("inclusion", "exclusion")]
    return hostfile_problems(hostfile, *counts, *[str(f) if f else None for f in filters])
