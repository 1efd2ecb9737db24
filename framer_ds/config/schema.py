"""The run config schema shared by every task.

Every model forbids unknown keys: a misspelled `gradient_acumulation_steps` must fail before a job
queues, not be ignored for three hours. Task-specific `model:` and `data:` sections are supplied by
the task (see `framer_ds.tasks.registry`) and combined with this base by `run_config_class`.
"""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from framer_ds.config.architectures import shipped_architecture, shipped_repo_ids

_UNSET_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(text: str) -> Path:
    """`~` and `$VARS` expanded, as a shell would; an unset variable is an error, not a literal `$X`
    directory (a literal `~` directory was what `output_dir: ~/runs/x` used to create)."""
    expanded = os.path.expandvars(os.path.expanduser(text))
    unset = _UNSET_VARIABLE.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise ValueError(
            f"environment variable {name} in {text!r} is not set; export it or write the path out"
        )
    return Path(expanded)


def _from_config_text(annotation: Any, value: Any) -> Any:
    """The two conversions a strict schema still needs from YAML/JSON text: a string to a `Path`
    (expanded) and a list to a `tuple`, wherever the annotation has them (inside `| None`, lists)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            converted = _from_config_text(member, value)
            if converted is not value:
                return converted
        return value
    if annotation is Path and isinstance(value, str):
        return expand_path(value)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation) or (Any,)
        return [_from_config_text(item, v) for v in value]
    if origin is tuple and isinstance(value, list):
        items = typing.get_args(annotation)
        if len(items) == len(value):
            return tuple(_from_config_text(a, v) for a, v in zip(items, value, strict=True))
    return value


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated, and types are
    strict: `max_steps: true` or `epochs: 2.5` is an error, never silently 1 or 2. Paths are the one
    conversion from text (with `~` and `$VARS` expanded), lists become tuples where a tuple is declared.

    No float field takes NaN or inf (`allow_inf_nan=False`, one rule for every section of every task):
    `adam_epsilon: 1e400` reads as inf, passed `gt=0`, and trained nothing with exit 0. A field that
    means something by inf must say so in its description and opt in with `Field(allow_inf_nan=True)`."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        protected_namespaces=(),
        strict=True,
        allow_inf_nan=False,
    )
    # Keys this section used to have, {old: new}, both relative to the section (the new one may be
    # dotted, into a subsection): an old config gets "renamed to ..." (framer_ds.config.renames).
    renamed_keys: ClassVar[dict[str, str]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _paths_and_tuples_from_text(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        return value if field is None else _from_config_text(field.annotation, value)


class TrainConfig(StrictModel):
    """Optimisation, schedule, precision and checkpointing. The single source of truth for batch
    size, accumulation, clipping and precision: DeepSpeed JSONs keep those fields "auto"."""

    seed: int = Field(42, description="Seeds python, numpy, torch and the data order.")
    max_steps: int | None = Field(
        None, ge=1, description="Optimizer steps to run; when set it wins over `epochs`."
    )
    epochs: int = Field(1, ge=1, description="Passes over the training set (used when max_steps is null).")
    micro_batch_size: int = Field(8, ge=1, description="Samples per process per forward pass.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    learning_rate: float = Field(1e-4, gt=0, description="Peak AdamW learning rate (after warmup).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW second-moment decay.")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW denominator epsilon.")
    lr_scheduler: Literal["cosine", "linear", "constant"] = Field(
        "cosine",
        description="Decay after the linear warmup: cosine or linear to 0, or none (constant).",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup in optimizer steps.")
    warmup_ratio: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Linear warmup as a share of all optimizer steps (instead of warmup_steps), so it "
        "means the same at any number of processes.",
    )
    max_grad_norm: float = Field(
        1.0, ge=0, description="Gradient clipping norm; 0 disables. Filled into DeepSpeed's 'auto'."
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Autocast dtype (DDP) or the DeepSpeed engine's dtype."
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no_is_false(cls, value: object) -> object:
        """YAML 1.1 reads a bare `no` (`mixed_precision: no`, `train.mixed_precision=no`) as false."""
        return "no" if value is False else value

    eval_every: int | None = Field(
        None, ge=1, description="Evaluate every N optimizer steps (and always at the end); null = end only."
    )
    eval_every_epochs: float | None = Field(
        None,
        gt=0,
        description="Evaluate every N epochs (fractions allowed), resolved into optimizer steps once the "
        "data and the number of processes are known; instead of eval_every.",
    )
    best_metric: str | None = Field(
        None,
        description="Keep output_dir/best/ (the task's export, plus best.json) at the evaluation where this "
        "metric was best so far, e.g. eval/loss or eval/accuracy; needs an eval set; null = off.",
    )
    best_mode: Literal["max", "min"] | None = Field(
        None,
        validate_default=True,
        description="Whether a higher (max, e.g. eval/accuracy) or lower (min, e.g. eval/loss) "
        "best_metric is better; required with best_metric.",
    )

    @field_validator("best_metric", mode="after")
    @classmethod
    def _best_metric_is_an_eval_metric(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("eval/") or value == "eval/"):
            raise ValueError(
                "best_metric names an evaluation metric as metrics.jsonl writes it, starting with 'eval/' "
                f"(e.g. eval/loss, eval/accuracy): write 'eval/{value.split('/')[-1]}'"
            )
        return value

    @field_validator("best_mode", mode="after")
    @classmethod
    def _best_mode_with_best_metric(cls, value: str | None, info: ValidationInfo) -> str | None:
        metric = info.data.get("best_metric")
        if "best_metric" not in info.data:  # best_metric itself failed: reported there
            return value
        if metric is not None and value is None:
            raise ValueError(
                f"best_metric is {metric!r}: set best_mode to max if a higher value is better "
                "(accuracy, IoU) or min if a lower one is (loss)"
            )
        if metric is None and value is not None:
            raise ValueError("best_mode has no effect without best_metric: set both (e.g. eval/loss, min)")
        return value

    checkpoint_every: int | None = Field(
        None, ge=1, description="Write a resumable checkpoint every N optimizer steps; null = never."
    )
    checkpoint_every_epochs: float | None = Field(
        None,
        gt=0,
        description="Write a checkpoint every N epochs (fractions allowed); instead of checkpoint_every.",
    )
    keep_last_checkpoints: int = Field(2, ge=1, description="Older checkpoints are deleted.")
    resume: str | None = Field(
        None, description="null, 'latest' (newest complete checkpoint in output_dir) or a checkpoint path."
    )

    resume_allow_changes: list[str] = Field(
        default_factory=list,
        description="Keys (dotted, e.g. data.root) that may differ from the checkpoint's config on resume "
        "although they change the model, the data or its order; for harmless edits such as moved files.",
    )

    @field_validator("resume", mode="after")
    @classmethod
    def _expand_resume_path(cls, value: str | None) -> str | None:
        return value if value in (None, "latest") else str(expand_path(value))

    nonfinite_loss: Literal["skip", "abort"] = Field(
        "skip",
        description="A NaN/inf loss: 'skip' drops that optimizer step (counted and logged), 'abort' stops.",
    )
    max_consecutive_nonfinite: int = Field(
        5, ge=1, description="Abort after this many skipped optimizer steps in a row (divergence)."
    )
    collective_timeout_s: int = Field(
        1800, ge=10, description="A rank that stops answering fails the job after this long, not never."
    )
    log_every: int = Field(1, ge=1, description="Write a metrics line every N optimizer steps.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    max_eval_batches: int | None = Field(None, ge=1, description="Cap eval cost on huge val sets.")

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainConfig:
        pairs = (
            ("eval_every", "eval_every_epochs"),
            ("checkpoint_every", "checkpoint_every_epochs"),
            ("warmup_steps", "warmup_ratio"),
        )
        both = [
            f"train.{a} and train.{b}" for a, b in pairs if getattr(self, a) and getattr(self, b) is not None
        ]
        if both:
            raise ValueError(f"set one of {'; one of '.join(both)}: they say the same thing in two units")
        return self

    def global_batch_size(self, data_parallel_size: int) -> int:
        """Samples per optimizer step across all ranks: micro-batch x accumulation x data-parallel ranks."""
        return self.micro_batch_size * self.gradient_accumulation_steps * data_parallel_size


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


def run_config_class(task_name: str, model_cls: type[BaseModel], data_cls: type[BaseModel]) -> type:
    """The full schema for one task: the shared base plus the task's `model:` and `data:` sections."""
    return create_model(
        f"RunConfig_{task_name}",
        __base__=RunConfigBase,
        model=(model_cls, Field(default_factory=model_cls, description="Task-specific model options.")),
        data=(data_cls, Field(description="Task-specific data options.")),
    )
