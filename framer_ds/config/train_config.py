"""`train:`: the run's length, batch, precision and resume at the top, and one section per component
(optimizer, LR schedule, evaluation, checkpoints, non-finite losses), as torchtune groups its config.

Why grouped: 31 flat keys read as one list where `max_grad_norm` sat between the LR schedule and
precision, and four "steps or epochs" pairs said the same thing twice; every "how long / how often" is
now one `Cadence`. The old flat keys are in `TrainConfig.renamed_keys`, so an old YAML is told each new
name and a run directory written before the rename still resumes, evaluates and samples.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from framer_ds.config.cadence import Cadence, units_check
from framer_ds.config.strict import StrictModel, expand_path


class OptimizerConfig(StrictModel):
    """AdamW and gradient clipping."""

    name: Literal["adamw", "adamw_8bit"] = Field(
        "adamw",
        description="'adamw': torch's AdamW, fp32 moments (8 bytes per trainable parameter). 'adamw_8bit': "
        "torchao's AdamW8bit, both moments block-wise quantized to 8 bits (2 bytes per parameter plus one "
        "fp32 scale per 256 values; tensors under 4,096 values keep fp32 moments), checkpointed and resumed "
        "exactly. torchao because it is maintained by PyTorch, runs on CPU and GPU alike (bitsandbytes' "
        "8-bit Adam needs CUDA) and its states are tensors that torch.save and FSDP2 handle. Not with "
        "DeepSpeed, whose ZeRO optimizer keeps its own fp32 states.",
    )
    learning_rate: float = Field(1e-4, gt=0, description="Peak AdamW learning rate (after warmup).")
    weight_decay: float = Field(
        0.0,
        ge=0,
        description="AdamW decoupled weight decay, on matrices only: biases and norm weights are exempt "
        "(as transformers' Trainer does).",
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    beta2: float = Field(0.999, ge=0, lt=1, description="AdamW second-moment decay.")
    epsilon: float = Field(1e-8, gt=0, description="AdamW denominator epsilon.")
    max_grad_norm: float = Field(
        1.0, ge=0, description="Gradient clipping norm; 0 disables. Filled into DeepSpeed's 'auto'."
    )


class LrScheduleConfig(StrictModel):
    """A linear warmup from 0, then the decay."""

    name: Literal["cosine", "linear", "constant"] = Field(
        "cosine",
        description="Decay after the linear warmup: cosine or linear to 0, or none (constant).",
    )
    warmup: Cadence | None = Field(
        None,
        description="Linear warmup: {steps: N}, {epochs: E} or {fraction: F} of all optimizer steps (a "
        "fraction or epochs mean the same at any number of processes); null = none.",
    )


class EvalConfig(StrictModel):
    """When to evaluate, how much, and which evaluation `best/` keeps."""

    every: Cadence | None = Field(
        None,
        description="Evaluate every {steps: N}, {epochs: E} (on the step that crosses each multiple of E) or "
        "{fraction: F} of the run, and always at the end; null = at the end only.",
    )
    max_batches: int | None = Field(None, ge=1, description="Cap eval cost on huge val sets.")
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


class CheckpointConfig(StrictModel):
    """Resumable checkpoints under output_dir/checkpoints/."""

    every: Cadence | None = Field(
        None,
        description="Write a resumable checkpoint every {steps: N}, {epochs: E} or {fraction: F} of the run; "
        "null = only on a stop signal.",
    )
    keep_last: int = Field(
        2,
        ge=1,
        description="Older checkpoints are deleted, except the checkpoint of the best evaluation "
        "(eval.best_metric), which is kept beside these and does not count.",
    )


class NonfiniteConfig(StrictModel):
    """What a NaN/inf loss does."""

    policy: Literal["skip", "abort"] = Field(
        "skip",
        description="A NaN/inf loss: 'skip' drops that optimizer step (counted and logged), 'abort' stops.",
    )
    max_consecutive: int = Field(
        5,
        ge=1,
        description="Abort after this many skipped optimizer steps in a row (divergence): steps skipped for "
        "a NaN/inf loss, and, counted apart, steps whose update the fp16 loss scaler skipped on an overflow.",
    )


class TrainConfig(StrictModel):
    """Optimisation, schedule, precision and checkpointing. The single source of truth for batch
    size, accumulation, clipping and precision: DeepSpeed JSONs keep those fields "auto"."""

    renamed_keys: ClassVar[dict[str, str]] = {
        "max_steps": "length.steps",
        "epochs": "length.epochs",
        "learning_rate": "optimizer.learning_rate",
        "weight_decay": "optimizer.weight_decay",
        "adam_beta1": "optimizer.beta1",
        "adam_beta2": "optimizer.beta2",
        "adam_epsilon": "optimizer.epsilon",
        "max_grad_norm": "optimizer.max_grad_norm",
        "lr_scheduler": "lr_schedule.name",
        "warmup_steps": "lr_schedule.warmup.steps",
        "warmup_ratio": "lr_schedule.warmup.fraction",
        "eval_every": "eval.every.steps",
        "eval_every_epochs": "eval.every.epochs",
        "max_eval_batches": "eval.max_batches",
        "best_metric": "eval.best_metric",
        "best_mode": "eval.best_mode",
        "checkpoint_every": "checkpoint.every.steps",
        "checkpoint_every_epochs": "checkpoint.every.epochs",
        "keep_last_checkpoints": "checkpoint.keep_last",
        "nonfinite_loss": "nonfinite.policy",
        "max_consecutive_nonfinite": "nonfinite.max_consecutive",
    }

    seed: int = Field(
        42,
        description="Seeds python, numpy, torch and the data order. The model is built from it on every "
        "rank; the draws of training (noise, dropout) come from a stream of each rank's own, derived from "
        "(seed, rank), rank 0's being the seed itself.",
    )
    length: Cadence = Field(
        default_factory=lambda: Cadence(epochs=1),
        description="How long the run trains: {steps: N} optimizer steps or {epochs: E} passes over the "
        "training set (fractions allowed: the run stops mid-epoch); exactly one; default {epochs: 1}.",
    )
    micro_batch_size: int = Field(8, ge=1, description="Samples per process per forward pass.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Autocast dtype (DDP) or the DeepSpeed engine's dtype."
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    checkpoint_blocks: bool = Field(
        False,
        description="Activation-checkpoint each of the task's repeated blocks whole (the blocks FSDP2 and "
        "compile use), beside the model's own gradient checkpointing: only each block's inputs are kept, "
        "one block is recomputed at a time in backward (e.g. SVD's temporal transformer blocks, which "
        "diffusers does not checkpoint). Costs one more forward of those blocks per step.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the trained model's repeated blocks in place (regional: one block's "
        "compile time, not the whole model's); plain, DDP, ZeRO-2 and FSDP2 runs, with or without gradient "
        "checkpointing. Refused under ZeRO-3, where it runs but slower than eager (docs/benchmarks.md).",
    )
    log_every: int = Field(1, ge=1, description="Write a metrics line every N optimizer steps.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    collective_timeout_s: int = Field(
        1800, ge=10, description="A rank that stops answering fails the job after this long, not never."
    )
    resume: str | None = Field(
        None,
        description="null, 'latest' (newest complete checkpoint in output_dir), 'best' (the checkpoint of "
        "the best evaluation by eval.best_metric: the newest one at or before its step; newer checkpoints "
        "move to checkpoints/abandoned/) or a checkpoint path.",
    )
    resume_allow_changes: list[str] = Field(
        default_factory=list,
        description="Keys (dotted, e.g. data.root) that may differ from the checkpoint's config on resume "
        "although they change the model, the data or its order; for harmless edits such as moved files.",
    )
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="AdamW's hyperparameters and gradient clipping."
    )
    lr_schedule: LrScheduleConfig = Field(
        default_factory=LrScheduleConfig, description="The learning-rate schedule: warmup, then decay."
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Evaluation cadence and cost, and best-model tracking."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Resumable checkpoints: how often, how many kept."
    )
    nonfinite: NonfiniteConfig = Field(
        default_factory=NonfiniteConfig, description="The policy for NaN/inf losses."
    )

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no_is_false(cls, value: object) -> object:
        """YAML 1.1 reads a bare `no` (`mixed_precision: no`, `train.mixed_precision=no`) as false."""
        return "no" if value is False else value

    @field_validator("length", mode="after")
    @classmethod
    def _length_in_steps_or_epochs(cls, value: Cadence) -> Cadence | None:
        """A fraction of the run cannot say how long the run is."""
        return units_check(value, ("steps", "epochs"), "a share of the run cannot set the run's length")

    @field_validator("resume", mode="after")
    @classmethod
    def _expand_resume_path(cls, value: str | None) -> str | None:
        return value if value in (None, "latest", "best") else str(expand_path(value))

    def global_batch_size(self, data_parallel_size: int) -> int:
        """Samples per optimizer step across all ranks: micro-batch x accumulation x data-parallel ranks."""
        return self.micro_batch_size * self.gradient_accumulation_steps * data_parallel_size
