"""The small protocol every task implements; the training loop knows nothing else about a task.

A task builds the one trainable model (the only module that goes through `accelerator.prepare`),
any frozen helpers (moved to the device outside DeepSpeed), the datasets, the loss for a batch (a
mean, or a sum plus the number of items it sums over), per-sample eval values that are summed over
the eval set, the exported artefact in `final/`, and what `framer-ds sample` makes from that export.
A command only some tasks have (`framer-ds data tracks`) is no hook here: those tasks declare it
(`TaskCommand` in tasks/<task>/commands.py, listed in tasks/registry.py). What only `framer-ds plan`
asks (an example batch, frozen helpers to count) is no hook here either: a task opts into those with
`tasks.planning.PlanningHooks`. The order of the phases that build a run (prepare_data ->
build_datasets -> setup_frozen -> precompute -> build_model) is written once, in `tasks.assemble`.
docs/architecture.md has a minimal example task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field
from torch.utils.data import Dataset, Sampler

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.schema import RunConfigBase, StrictModel, run_config_class
from framer_ds.engine.export import write_export_record

if TYPE_CHECKING:
    from accelerate import Accelerator


class SampleCommandOptions(StrictModel):
    """Options every task's `framer-ds sample` takes; a task's own options subclass this."""

    device: str = Field(
        "auto", description="Where to run: 'auto' (the GPU when there is one), 'cpu', 'cuda', 'cuda:1'."
    )

    def resolved_device(self) -> str:
        return resolve_device(self.device)


def resolve_device(name: str) -> str:
    """'auto' -> the GPU when there is one, else the CPU; any other name as given."""
    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class TrainingLoss:
    """What `training_loss` returns when the task also reports parts of its loss (e.g. text vs audio
    tokens): the loss to back-propagate, and per part a (summed loss, items) pair on the device. The loop
    sums the pairs over the steps since the last log line and all ranks, and logs sum / items under
    each name, so a part is exact however the micro-batches split it."""

    loss: torch.Tensor
    parts: dict[str, tuple[torch.Tensor, torch.Tensor]]


class Task(ABC):
    """Subclass, set the class attributes, implement the abstract methods, decorate with `@register_task`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    ModelConfig: ClassVar[type[StrictModel]]
    DataConfig: ClassVar[type[StrictModel]]
    full_precision_keys: ClassVar[frozenset[str]] = frozenset()
    """Batch keys DeepSpeed's bf16/fp16 batch cast leaves alone (conditioning scalars)."""
    loss_reduction: ClassVar[Literal["mean", "sum"]] = "mean"
    """"mean": `training_loss` returns a batch mean. "sum": it returns a sum over the items
    `count_loss_items` counts (tokens, pixels), and the loop divides by the items of the whole
    accumulation window on all ranks, so unequal micro-batches weigh every item equally."""
    loss_items_name: ClassVar[str] = "tokens"
    """What a summing task counts; the loop logs `<name>_per_s` next to `samples_per_s`."""
    loss_parts: ClassVar[tuple[str, ...]] = ()
    """Names of the parts `training_loss` reports in a `TrainingLoss` (logged next to `loss`)."""
    sample_options: ClassVar[type[SampleCommandOptions]] = SampleCommandOptions
    """The options of `framer-ds sample` for this task (its flags are made from the fields)."""
    export_options: ClassVar[type[StrictModel] | None] = None
    """The options of `framer-ds export` (e.g. merging an adapter into its base); None: no such command."""

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

    def data_summary(self) -> dict[str, Any]:
        """Lines for the run summary about where the data came from (e.g. how validation was made).
        Called after `build_datasets`."""
        return {}

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The trainable model; requires_grad marks what the optimizer updates."""

    @abstractmethod
    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """(train, eval-or-None)."""

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        return None

    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        """Class names of the model's repeated blocks. Under FSDP2 each instance becomes its own shard
        unit, so only one block's full parameters exist at a time (the root unit holds the rest).
        Default: transformers' `_no_split_modules` (the blocks it never splits across devices) that
        the model holds, except a block holding the input embedding: accelerate shards that embedding
        as a unit of its own, and a parent unit around it would shard it twice (ViT's ViTEmbeddings).
        A task whose model is no transformers model names its blocks itself."""
        embedding = getattr(model, "get_input_embeddings", lambda: None)()
        present = {type(module).__name__ for module in model.modules()}
        around_embedding = {
            type(module).__name__
            for module in model.modules()
            if embedding is not None and any(sub is embedding for sub in module.modules())
        }
        # A set on a built model: sorted, so every rank (each with its own hash seed) says the same.
        names = getattr(model, "_no_split_modules", None) or []
        return sorted(name for name in names if name in present and name not in around_embedding)

    def setup_frozen(self, accelerator: Accelerator) -> None:
        """Move frozen helpers (VAE, encoders) to the device; they never go through `prepare`.
        Called on every rank before `precompute` and before the trainable model is built
        (`tasks.assemble`)."""
        return None

    def frozen_helpers_placement(self) -> str | None:
        """Where the frozen helpers (a VAE, an image or text encoder) live during training, for the run
        summary, e.g. "VAE + image encoder: not loaded (latent cache complete)"; called after
        `precompute`. Why: a helper on the GPU all run costs its weights in every step's memory, so a
        user checking whether a run fits needs to see it. None (the default): the task has no helpers."""
        return None

    def precompute(
        self, accelerator: Accelerator, train_set: Dataset, eval_set: Dataset | None
    ) -> tuple[Dataset, Dataset | None]:
        """The datasets training reads, e.g. outputs of frozen encoders cached to disk once. Every rank
        calls it (with the raw datasets from `build_datasets`; what it needs of them it reads from
        them, not from the task); the default reads the raw data."""
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

    def train_sampler(self, train_set: Dataset) -> Sampler | None:
        """The order of the training samples, or None for a seeded shuffle. A sampler must yield every
        index of `train_set` once per epoch (len(train_set) in all), the same on every rank (accelerate
        splits its batches between the ranks), and follow `set_epoch(epoch)`, so resuming mid-epoch
        replays the same order; e.g. length-grouped batches or a mixing ratio."""
        return None

    def optimizer_groups(self, model: torch.nn.Module) -> list[dict[str, Any]] | None:
        """The optimizer's param groups, `[{"params": [...], "lr": ...}, ...]`, when some trainable
        parameters need their own learning rate (e.g. a full-rank embedding beside a LoRA); the groups
        cover every trainable parameter once, a group without "lr" takes train.optimizer.learning_rate,
        and the schedule scales each group alike. None (the default): one group of all of them."""
        return None

    @abstractmethod
    def training_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | TrainingLoss:
        """Scalar loss for one micro-batch: its mean, or with `loss_reduction = "sum"` its sum over the
        items `count_loss_items` counts. Never divided by accumulation: the loop and accelerate do that.
        A `TrainingLoss` also carries the parts named in `loss_parts`."""

    def count_loss_items(self, batch: Any) -> int | torch.Tensor:
        """Items the summed loss of `batch` runs over (e.g. labels != -100). Read before the forward,
        so the loop knows a window's total before the first backward. Summing tasks implement it."""
        raise NotImplementedError(
            f"task {self.name!r} sets loss_reduction = 'sum' and must implement count_loss_items(batch)"
        )

    def log_labels(self) -> dict[str, str]:
        """Text fields for the next training line of metrics.jsonl, about the steps since the last line
        (e.g. the shape bucket they trained), then forgotten. The main process logs its own: a task whose
        labels could differ between ranks agrees them itself."""
        return {}

    @abstractmethod
    def eval_step(self, model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Per-sample values (first dim = batch, any trailing shape, e.g. [B, classes]). The loop sums
        each over the whole eval set on every rank (samples duplicated to even out the last batch are
        dropped) and hands the totals to `summarize_eval`."""

    def summarize_eval(self, sums: dict[str, torch.Tensor], num_samples: int) -> dict[str, float]:
        """Totals over the eval set -> `eval/<name>` metrics. The default is the per-sample mean (a
        vector value is averaged over its elements too); a task reporting e.g. per-class intersections
        and unions, or summed losses and token counts, divides its own totals here."""
        return {f"eval/{k}": (v.double() / max(num_samples, 1)).mean().item() for k, v in sums.items()}

    def checkpoint_artifacts(
        self, accelerator: Accelerator, model: torch.nn.Module, checkpoint_dir: Path
    ) -> None:
        """Extra files in every checkpoint (e.g. a LoRA adapter usable without resuming). Every rank."""
        return None

    @abstractmethod
    def export(self, accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
        """Write the final artefact (safetensors). Called on EVERY rank: gathering is a collective."""

    def export_with_record(self, accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
        """`export` plus the record naming this task and its resolved config, which is how
        `framer-ds sample DIR` knows what DIR holds. Every export directory goes through here."""
        self.export(accelerator, model, out_dir)
        if accelerator.is_main_process:
            config = self.config.model_dump(mode="json")
            write_export_record(out_dir, self.name, config, self.export_record_fields())

    def export_record_fields(self) -> dict[str, Any]:
        """Facts of this task's exports recorded beside the config in framer_ds_export.json (e.g. the
        base model an adapter loads into). None by default."""
        return {}

    def generation_metrics(
        self, accelerator: Accelerator, model: torch.nn.Module, in_training: bool
    ) -> dict[str, float]:
        """`eval/*` metrics of what the model generates (tts_lm: speech scored by an offline ASR and a
        speaker encoder), which no per-sample sum of `eval_step` can give. Called on EVERY rank right
        after the totals of each evaluation, while training (`in_training`) and in `framer-ds eval`;
        returns the same metrics on every rank. None by default."""
        return {}

    def eval_details(self, sums: dict[str, torch.Tensor], num_samples: int) -> dict[str, Any]:
        """Sections `framer-ds eval` writes into eval.json beside the metrics, from the same totals as
        `summarize_eval`: breakdowns too long for a metrics line (a per-class table of 1,000 classes
        would flood every eval line and tracker). None by default."""
        return {}

    def load_export(self, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """The model `framer-ds eval RUN` evaluates: `model` (as `build_model` made it, before `prepare`)
        with the weights of this task's export (`final/`, `best/`), or, where the export has another
        form than the training model (a LoRA merged into its base), the model that export loads into.
        Tasks that support it override this."""
        problem = ConfigProblem(str(export_dir), f"task {self.name!r} cannot load its export to evaluate it")
        raise ConfigError([problem])

    def export_command(self, export_dir: Path, options: StrictModel) -> str:
        """`framer-ds export EXPORT_DIR ...`: another form of an export (a merged model); returns what to
        print. Tasks with `export_options` implement it."""
        raise ConfigError(
            [
                ConfigProblem(
                    str(export_dir), f"task {self.name!r} has no `framer-ds export`; final/ is its export"
                )
            ]
        )

    def sample(self, export_dir: Path, options: SampleCommandOptions) -> str:
        """Generate from an export of this task (`framer-ds sample`); returns what to print."""
        raise ConfigError(
            [ConfigProblem(str(export_dir), f"task {self.name!r} does not implement `framer-ds sample`")]
        )
