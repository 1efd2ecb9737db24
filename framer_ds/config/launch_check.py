"""Pre-flight cross-checks: training YAML x accelerate YAML x DeepSpeed JSON (the facts are in
docs/architecture.md, "Accelerate + DeepSpeed").

The rules live in accelerate_yaml_rules.py and deepspeed_json_rules.py, one small function each that
returns every problem it finds, so a user fixes all of them in one edit; this module runs them over the
files a launch names and again at training start. Nothing heavy is imported (no torch, no accelerate,
no model): `framer-ds validate` runs in a second, and the JSON rules run again at training start from
what `accelerate launch` put in the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framer_ds.config.accelerate_yaml_rules import (
    IGNORED_WITH_CONFIG_FILE,
    check_accelerate_counts,
    check_accelerate_keys,
    check_accelerate_precision,
    check_deepspeed_source,
    check_ignored_with_config_file,
    check_plugin_values_match_train,
    is_deepspeed,
)
from framer_ds.config.deepspeed_json_rules import check_deepspeed_json
from framer_ds.config.errors import ConfigProblem
from framer_ds.config.fsdp_yaml_rules import check_fsdp_config, fsdp_lever_problems
from framer_ds.config.launch_files import Problems, load_json_config, load_yaml_file, mapping_section
from framer_ds.config.launch_files import problem_at as _p
from framer_ds.config.schema import TrainConfig
from framer_ds.config.zero_fields import fixed_bucket_warning

_DS_FILE = "deepspeed_config.deepspeed_config_file"


def _resolve_json(name: str, yaml_path: Path, src: str) -> tuple[Path | None, Problems]:
    """accelerate opens the path from the launch directory; the YAML's own directory is a fallback."""
    path, beside = Path(name), yaml_path.parent / name
    if path.is_file():
        return path, []
    if not path.is_absolute() and beside.is_file():
        msg = f"{name!r} exists only next to the YAML, but accelerate opens it from where you launch;"
        return beside, [_p(src, _DS_FILE, msg + f" write {str(beside)!r} (repo-root relative) or absolute")]
    msg = f"{name!r} not found in {Path.cwd()} nor in {yaml_path.parent}; fix the path (repo-root relative)"
    return None, [_p(src, _DS_FILE, msg)]


def check_launch_configs(
    train: TrainConfig | None,
    accelerate_config: Path | None = None,
    deepspeed_config: Path | None = None,
    launch_flags: Mapping[str, Any] | None = None,
    warnings: list[str] | None = None,
    base_precision: str = "full",
) -> list[ConfigProblem]:
    """Every problem across the three configs; `deepspeed_config` mirrors --deepspeed_config_file and
    `launch_flags` the `accelerate launch` flags that beat the YAML's keys (num_processes, num_machines,
    machine_rank, main_process_ip, main_process_port). Costly but legal choices (a fixed 5e8 bucket) are
    appended to `warnings` when given; `base_precision` is the run's model.base_precision."""
    problems: Problems = []
    json_path = Path(deepspeed_config) if deepspeed_config is not None else None
    if accelerate_config is not None:
        acc, problems = load_yaml_file(Path(accelerate_config))
        if acc is not None:
            acc = {**acc, **(launch_flags or {})}
            src, explicit = str(accelerate_config), json_path is not None
            yaml_json = mapping_section(acc, "deepspeed_config").get("deepspeed_config_file")
            problems += check_accelerate_keys(acc, src)
            problems += check_accelerate_counts(acc, src)
            problems += check_accelerate_precision(acc, src, train)
            problems += check_ignored_with_config_file(acc, src, explicit or bool(yaml_json))
            problems += check_plugin_values_match_train(acc, src, train)
            problems += check_deepspeed_source(acc, src, explicit)
            problems += check_fsdp_config(acc, src, train, base_precision)
            if not explicit and yaml_json and is_deepspeed(acc):
                json_path, found = _resolve_json(str(yaml_json), Path(accelerate_config), src)
                problems += found
    if json_path is not None:
        ds, load_problems = load_json_config(json_path)
        problems += load_problems
        if ds is not None:
            problems += check_deepspeed_json(ds, str(json_path), train, base_precision)
            mixed = train.mixed_precision if train is not None else "no"
            warning = fixed_bucket_warning(mapping_section(ds, "zero_optimization"), mixed)
            if warnings is not None and warning is not None:
                warnings.append(f"{json_path}: zero_optimization.{warning}")
    return problems


# --- runtime (inside `accelerate launch`) -----------------------------------------------------------


def _env_overrides(env: Mapping[str, str], train: TrainConfig) -> Problems:
    """Precision/accumulation/clipping that `accelerate launch` flags or YAML keys set against the YAML."""
    out, mixed = [], env.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if mixed in ("bf16", "fp16") and train.mixed_precision not in ("no", mixed):
        msg = f"is {mixed!r} but train.mixed_precision is {train.mixed_precision!r}; drop --mixed_precision"
        out.append(_p("environment", "ACCELERATE_MIXED_PRECISION", msg + " and the accelerate YAML's key"))
    for var, owner, want in (
        (
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
            "gradient_accumulation_steps",
            train.gradient_accumulation_steps,
        ),
        ("ACCELERATE_GRADIENT_CLIPPING", "optimizer.max_grad_norm", train.optimizer.max_grad_norm),
    ):
        value = env.get(var, "auto")
        if value != "auto" and value != str(want) and value != str(float(want)):
            msg = f"is {value} but train.{owner} is {want}; accelerate's value wins: drop the flag / YAML key"
            out.append(_p("environment", var, msg))
    return out


def _fsdp_env_problems(env: Mapping[str, str]) -> Problems:
    """What `accelerate launch` flags can still change after `validate` read the YAML: the FSDP version
    (--fsdp_version) and the process count (--num_processes), either of which trains unsharded copies."""
    out = []
    if env.get("FSDP_VERSION", "1") != "2":
        version = env.get("FSDP_VERSION", "1")
        msg = f"is {version}; framer_ds runs FSDP2 only: set fsdp_version: 2 (or --fsdp_version 2)"
        out.append(_p("environment", "FSDP_VERSION", msg))
    if env.get("WORLD_SIZE", "1") == "1":
        msg = (
            "is 1: FSDP with one process shards nothing (accelerate falls back to plain training); launch 2+"
        )
        out.append(_p("environment", "WORLD_SIZE", msg))
    return out


def check_runtime_environment(train: TrainConfig, base_precision: str = "full") -> list[ConfigProblem]:
    """The same checks at training start, from the env vars accelerate's DeepSpeed / FSDP launcher sets."""
    env = os.environ
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return _env_overrides(env, train) + _fsdp_env_problems(env) + fsdp_lever_problems(base_precision)
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return []
    problems = _env_overrides(env, train)
    json_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if json_file != "none":
        fields = sorted(set(env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",")) & IGNORED_WITH_CONFIG_FILE)
        if fields:
            msg = (
                f"the accelerate YAML sets {fields} next to a DeepSpeed JSON (accelerate raises); delete them"
            )
            problems.append(_p("environment", "ACCELERATE_CONFIG_DS_FIELDS", msg))
        ds, load_problems = load_json_config(Path(json_file))
        problems += load_problems
        if ds is not None:
            problems += check_deepspeed_json(ds, json_file, train, base_precision)
    return problems
