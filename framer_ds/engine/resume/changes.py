"""What a resumed run's config may change from the checkpoint's, and the list a user sees.

Why: a resume used to take whatever the new YAML said and write it to config.yaml, while part of it
was silently ignored (a new learning rate lost to the restored scheduler) and part of it silently
broke the run (a new micro-batch size resumed at the wrong data position). Now a change that breaks
the run's meaning is refused with every difference listed, and the rest is applied and logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError
from framer_ds.config.loader import parse_yaml
from framer_ds.config.renames import migrate_recorded
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.checkpoint import CHECKPOINT_CONFIG, TrainerState, checkpoints_root

# The model, the data and what decides the data order and its position: changing any of them on
# resume is a different experiment wearing the old one's checkpoint.
FROZEN = ("task", "model", "data", "train.micro_batch_size", "train.seed", "train.mixed_precision")
# How a run is resumed, not what it computes.
NOT_COMPARED = ("output_dir", "overwrite_output_dir", "train.resume", "train.resume_allow_changes", "imports")
ACCUMULATION = "train.gradient_accumulation_steps"
# What the best value in the checkpoint was judged by: another metric or mode makes it meaningless.
BEST_TRACKING = ("train.eval.best_metric", "train.eval.best_mode")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _under(key: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def _recorded_config(recorded: dict[str, Any], schema: type[RunConfigBase]) -> dict[str, Any]:
    """The checkpoint's config as this version reads it: renamed keys moved and migrated, then
    validated by the run's schema, so that a migration which is more than a move compares equal (an old
    `config: {}` beside a model path is no `source.config`); as moved where it no longer validates (its
    differences are listed)."""
    moved = migrate_recorded(recorded, schema)
    try:
        return schema.model_validate(moved).model_dump(mode="json")
    except ValidationError:
        return moved


def resume_changes(
    checkpoint: Path, config: RunConfigBase, state: TrainerState, world_size: int
) -> list[str]:
    """The applied changes as "key: old -> new" lines; raises ConfigError listing the refused ones.

    Gradient accumulation may change only together with the number of processes and so that the
    global batch stays the same (the documented way to resume at another world size)."""
    recorded_path = Path(checkpoint) / CHECKPOINT_CONFIG
    recorded = (parse_yaml(recorded_path.read_text()) or {}) if recorded_path.is_file() else None
    _refuse_another_task(checkpoint, recorded, config)
    past_the_end = _past_max_steps(checkpoint, config, state)
    if past_the_end:
        raise ConfigError(past_the_end, "resume")
    if recorded is None:
        return [
            f"(no {CHECKPOINT_CONFIG} in {checkpoint}: written before framer_ds 0.2, changes not checked)"
        ]
    old = _flatten(_recorded_config(recorded, type(config)))
    new = _flatten(config.model_dump(mode="json"))
    allowed = list(config.train.resume_allow_changes)
    changed = [
        (key, old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and not _under(key, NOT_COMPARED)
    ]
    refused, applied = [], []
    for key, before, after in changed:
        line = f"{key}: {before!r} -> {after!r}"
        if key == ACCUMULATION and _same_global_batch(config, before, state.world_size, world_size):
            applied.append(line + " (the global batch stays the same at the new number of processes)")
        elif _under(key, (*FROZEN, ACCUMULATION)) and not _under(key, allowed):
            refused.append(ConfigProblem(key, f"{before!r} in the checkpoint, {after!r} now"))
        elif key in BEST_TRACKING:
            applied.append(line + _best_tracking_note(config))
        else:
            applied.append(line)
    if refused:
        raise ConfigError(
            [
                *refused,
                ConfigProblem(
                    "train.resume",
                    f"these differ from the config stored in {checkpoint} and would change what the run "
                    "means (model, data, data order or position). Put them back, start a new run in another "
                    "output_dir, or, if the change is harmless (e.g. data.source.path after moving the same "
                    "files), list the keys in train.resume_allow_changes.",
                ),
            ],
            "resume",
        )
    return applied


def _refuse_another_task(checkpoint: Path, recorded: Any, config: RunConfigBase) -> None:
    """A checkpoint of another task (a run directory reused for another config, a wrong
    train.resume=PATH) is refused in one line naming both tasks. Its config differs from this run's in
    every model and data key, so the list of differences said nothing useful, and no key of
    train.resume_allow_changes can make another task's weights load: only another output_dir can."""
    task = recorded.get("task") if isinstance(recorded, dict) else None
    if task is None or task == config.task:
        return
    if Path(checkpoint).parent == checkpoints_root(Path(config.output_dir)):
        fix = (
            f"{config.output_dir} holds a {task!r} run: train {config.task!r} in another output_dir (or "
            f"start over here with --overwrite, which deletes the {task!r} run)"
        )
    else:
        fix = f"point train.resume at a checkpoint of a {config.task!r} run"
    raise RunSetupError(
        f"{checkpoint} was written by task {task!r} but this run is task {config.task!r}; a checkpoint "
        f"resumes only the task that wrote it: {fix}"
    )


def _past_max_steps(checkpoint: Path, config: RunConfigBase, state: TrainerState) -> list[ConfigProblem]:
    """A checkpoint already past `train.length.steps` cannot be trained back to it: the run used to
    export final/ as if trained to that length from weights trained further. Checked before anything is
    written."""
    limit = config.train.length.steps
    if limit is None or state.global_step <= limit:
        return []
    return [
        ConfigProblem(
            "train.length.steps",
            f"is {limit} but {checkpoint} is at step {state.global_step}: a resumed run cannot end before "
            f"its checkpoint. Set train.length.steps to {state.global_step} or more, or resume from a "
            f"checkpoint at step {limit} or earlier (train.resume=PATH; output_dir/checkpoints/step_N)",
        )
    ]


def _best_tracking_note(config: RunConfigBase) -> str:
    if config.train.eval.best_metric is None:
        return " (best/ stays as it is and is no longer updated)"
    return (
        " (the best value in the checkpoint was judged otherwise: best/ is replaced at the next evaluation)"
    )


def _same_global_batch(config: RunConfigBase, old_accumulation: Any, old_world: int, new_world: int) -> bool:
    if not isinstance(old_accumulation, int) or old_world == new_world:
        return False
    micro = config.train.micro_batch_size
    return micro * old_accumulation * old_world == config.train.global_batch_size(new_world)
