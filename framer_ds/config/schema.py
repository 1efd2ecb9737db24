"""The run config schema shared by every task.

Every model forbids unknown keys: a misspelled `gradient_acumulation_steps` must fail before a job
queues, not be ignored for three hours. Task-specific `model:` and `data:` sections are supplied by
the task (see `framer_ds.tasks.registry`) and combined with this base by `run_config_class`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from framer_ds.config.architectures import shipped_architecture, shipped_repo_ids
from framer_ds.config.strict import StrictModel, expand_path
from framer_ds.config.train_config import TrainConfig

# The base of every section and the `train:` section, importable from here as before the split.
__all__ = [
    "LogConfig",
    "RunConfigBase",
    "StrictModel",
    "TrainConfig",
    "WandbConfig",
    "expand_path",
    "run_config_class",
]


class WandbConfig(StrictModel):
    """Weights & Biases through accelerate's tracker; offline mode needs no account."""

    project: str = Field("framer_ds", description="W&B project name.")
    entity: str | None = Field(None, description="W&B team or user; null = your default entity.")
    run_name: str | None = Field(None, description="Display name of the run; null = W&B picks one.")
    offline: bool = Field(False, description="Write runs under output_dir/wandb; `wandb sync` later.")


class LogConfig(StrictModel):
    wandb: WandbConfig | None = Field(None, description="null disables W&B.")
    tensorboard: bool = Field(False, description="Write TensorBoard events under output_dir/tensorboard.")


class RunConfigBase(StrictModel):
    """Fields every run has; `model` and `data` are added per task by `run_config_class`."""

    task: str = Field(description="Registered task name; `framer-ds tasks` lists them.")
    imports: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the task lookup, so your own @register_task "
        "classes (e.g. my_project.tasks) are available without editing framer_ds.",
    )
    output_dir: Path = Field(description="Run directory: config.yaml, metrics.jsonl, checkpoints/, final/.")
    overwrite_output_dir: bool = Field(
        False, description="Allow starting a fresh run in a directory that already holds one."
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="Optimisation, schedule, precision, checkpoints, faults."
    )
    log: LogConfig = Field(
        default_factory=LogConfig, description="Experiment trackers besides metrics.jsonl."
    )
    architectures: dict[str, str] = Field(
        default_factory=dict,
        description="Which published model each local model directory of this config is (or has the "
        "architecture of), as {directory: hub repo id}. `framer-ds plan` builds a directory that is not on "
        "disk from the config.json framer_ds ships for that repo id, so a job is sized before its "
        "download; training never reads these. Shipped ids: framer_ds/config/architectures/README.md.",
    )

    @field_validator("architectures", mode="after")
    @classmethod
    def _shipped_architectures(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted({repo for repo in value.values() if shipped_architecture(repo) is None})
        if unknown:
            shipped = ", ".join(shipped_repo_ids())
            raise ValueError(f"no shipped architecture for {', '.join(unknown)}; use one of {shipped}")
        return value

    @model_validator(mode="after")
    def _resume_and_overwrite_exclusive(self) -> RunConfigBase:
        if self.overwrite_output_dir and self.train.resume is not None:
            raise ValueError(
                "overwrite_output_dir=true and train.resume are contradictory: "
                "drop one (resume continues the run, overwrite starts it again)"
            )
        return self


BASE_PRECISION_FIELD = (
    Literal["full", "int8", "fp8"],
    Field(
        "full",
        description="How the frozen base's nn.Linear weights are stored (every Linear that does not train, "
        "e.g. under a LoRA): 'full' as the run computes; 'int8' weight-only with a per-row scale (torchao, "
        "QLoRA-style: ~1 byte per weight, LoRA trained on top in the compute dtype); 'fp8' likewise on GPUs "
        "of compute capability 8.9+ (refused elsewhere). Exports are unchanged (adapters; merges read the "
        "base from disk). Plain/DDP only: DeepSpeed's module cast cannot swap torchao's weights and FSDP2 "
        "cannot shard them (both refused by validate).",
    ),
)
"""`model.base_precision`: a key every task's `model:` section has (added by `run_config_class`), since
which weights are frozen is generic (engine/base_precision.py)."""
GENERIC_MODEL_KEYS = frozenset({"base_precision"})
"""Keys `run_config_class` adds to every task's `model:` section; a task re-reading its own section from a
record (an export) with its ModelConfig alone drops them."""


def run_config_class(task_name: str, model_cls: type[BaseModel], data_cls: type[BaseModel]) -> type:
    """The full schema for one task: the shared base plus the task's `model:` (with the generic
    `base_precision`) and `data:` sections."""
    model_section = create_model(model_cls.__name__, __base__=model_cls, base_precision=BASE_PRECISION_FIELD)
    model_section.__doc__ = model_cls.__doc__
    return create_model(
        f"RunConfig_{task_name}",
        __base__=RunConfigBase,
        model=(
            model_section,
            Field(default_factory=model_section, description="Task-specific model options."),
        ),
        data=(data_cls, Field(description="Task-specific data options.")),
    )
