"""The small protocol every task implements; the training loop knows nothing else about a task.

A task builds the one trainable model (the only module that goes through `accelerator.prepare`),
any frozen helpers (moved to the device outside DeepSpeed), the datasets, the loss for a batch,
per-sample eval values, and the exported artefact in `final/`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.config.schema import RunConfigBase, StrictModel, run_config_class

if TYPE_CHECKING:
    from accelerate import Accelerator


class Task(ABC):
    """Subclass, set the class attributes, implement the abstract methods, decorate with `@register_task`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    ModelConfig: ClassVar[type[StrictModel]]
    DataConfig: ClassVar[type[StrictModel]]
    full_precision_keys: ClassVar[frozenset[str]] = frozenset()
    """Batch keys DeepSpeed's bf16/fp16 batch cast leaves alone (conditioning scalars)."""

    def __init__(self, config: RunConfigBase):
        self.config = config

    @classmethod
    @cache
    def config_class(cls) -> type[RunConfigBase]:
        """The full run-config schema for this task (base + this task's model/data sections)."""
        return run_config_class(cls.name, cls.ModelConfig, cls.DataConfig)

    def check(self) -> list[ConfigProblem]:
        """Pre-flight checks that need no weights (paths exist, sizes valid); used by `validate`."""
        return []

    def prepare_data(self) -> None:
        """Create cached data the task needs (runs on the local main process before the others read)."""
        return None

    def data_report(self) -> str:
        """What `framer-ds data check` prints: counts and anything rejected. Raises ConfigError when
        the data is unusable. Tasks override it with a richer report."""
        train, evaluation = self.build_datasets()
        return (
            f"train: {len(train)} samples; eval: {len(evaluation) if evaluation is not None else 0} samples"
        )

    @property
    def model_has_hidden_size(self) -> bool:
        """Whether DeepSpeed's "auto" bucket sizes could be derived from the model config."""
        return False

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The trainable model; requires_grad marks what the optimizer updates."""

    @abstractmethod
    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """(train, eval-or-None)."""

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        return None

    def setup_frozen(self, accelerator: Accelerator) -> None:
        """Move frozen helpers (VAE, encoders) to the device; they never go through `prepare`.
        Called on every rank before `precompute` and before the trainable model is built."""
        return None

    def precompute(
        self, accelerator: Accelerator, train_set: Dataset, eval_set: Dataset | None
    ) -> tuple[Dataset, Dataset | None]:
        """The datasets training reads, e.g. outputs of frozen encoders cached to disk once. Every rank
        calls it (with the raw datasets from `build_datasets`); the default reads the raw data."""
        return train_set, eval_set

    def sample_every(self) -> int:
        """Optimizer steps between `write_samples` rounds (and one at the end); 0 = never."""
        return 0

    def write_samples(
        self, accelerator: Accelerator, model: torch.nn.Module, step: int, out_dir: Path
    ) -> list[Path]:
        """Generate media (videos, audio, images) from the model being trained, under `out_dir`.
        Called on EVERY rank; returns the written files on the main process."""
        return []

    @abstractmethod
    def training_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """Scalar loss for one micro-batch (not divided by accumulation: accelerate does that)."""

    @abstractmethod
    def eval_step(self, model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Per-sample values (first dim = batch) that are gathered across ranks and averaged."""

    def summarize_eval(self, values: dict[str, torch.Tensor]) -> dict[str, float]:
        """Gathered per-sample values -> `eval/<name>` metrics (mean by default)."""
        return {f"eval/{k}": v.float().mean().item() for k, v in values.items()}

    def checkpoint_artifacts(
        self, accelerator: Accelerator, model: torch.nn.Module, checkpoint_dir: Path
    ) -> None:
        """Extra files in every checkpoint (e.g. a LoRA adapter usable without resuming). Every rank."""
        return None

    @abstractmethod
    def export(self, accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
        """Write the final artefact (safetensors). Called on EVERY rank: gathering is a collective."""
