"""The hooks only the lab (`framer-ds plan`, `bench`, the census and the activation probe) asks of a task.

Why apart from `Task`: the training loop, `eval`, `export` and `sample` never call them, and a task that
is only trained should not have to read past eight planner hooks to see what it must implement. A task
that wants to tell the planner more than the defaults (a batch built from its config, frozen helpers, an
evaluation phase) subclasses `PlanningHooks` beside `Task` and overrides what it needs; the lab asks
`planning_hooks(task)`, which gives every task the full set, with these defaults where it has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from framer_ds.tasks.base import Task


class PlanningHooks:
    """Mixin for a task (`class MyTask(PlanningHooks, Task)`): what the planner measures, with defaults
    that read only the task's core (`prepare_data`, `build_datasets`, `collate_fn`)."""

    def prepare_model_assets(self) -> None:
        """Create what `build_model` and `example_batch` read (built-in tiny models, the class list of
        built-in data), and nothing slower: `framer-ds plan` calls it instead of `prepare_data`. The
        default is `prepare_data`; a task whose data preparation is heavy (encoding audio) overrides it."""
        self.prepare_data()

    def train_example_count(self) -> int | None:
        """Training examples, when counting them is cheap (an index, not a pass over the media): `plan`
        caps the largest micro-batch at each rank's share. None: unknown without reading the data."""
        return None

    def plan_assumptions(self) -> list[str]:
        """Lines `framer-ds plan` prints for what it assumed because files are not on disk yet (the data
        it would size the classifier head from, a tokenizer's length): called after the plan's census
        and probe, on the task they built."""
        return []

    def example_batch(self, micro_batch_size: int) -> Any:
        """A micro-batch with the LARGEST shapes training will meet, as `training_loss` receives it:
        what `framer-ds plan` runs forward and backward to measure activations. Values do not matter.
        The default collates the first items of the training set (so it reads the data); a task whose
        items vary in size (padded text) or whose training reads something other than the raw items
        (a latent cache) builds it from its config instead."""
        train_set, _ = self.build_datasets()
        if len(train_set) == 0:
            raise ConfigError([ConfigProblem("data", "the training set is empty; point it at the data")])
        items = [train_set[i % len(train_set)] for i in range(micro_batch_size)]
        return (self.collate_fn() or torch.utils.data.default_collate)(items)

    def frozen_helpers(self) -> list[torch.nn.Module]:
        """Frozen models outside the trained one that stay on every device through training (a VAE and an
        image encoder when latents are not cached). `framer-ds plan` counts them, calling this inside
        `engine.pretrained.empty_weights()`, so load them with `load_pretrained`."""
        return []

    def eval_only_helpers(self) -> list[torch.nn.Module]:
        """Frozen models that come to every device only while evaluating or sampling, beside
        `frozen_helpers` (a VAE a latent cache keeps off the device in training and sampling brings
        back). `framer-ds plan` counts them like `frozen_helpers`, inside `empty_weights()`."""
        return []

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The dtype each frozen helper runs in on the device (e.g. a VAE kept in fp32 where fp16
        overflows); the compute dtype by default."""
        return [compute] * len(helpers)

    def eval_transient(
        self, model: torch.nn.Module, helpers: list[torch.nn.Module], batch: dict[str, Any]
    ) -> None:
        """Run, under no_grad, what evaluation or sampling computes beyond the training step (a video
        task's denoiser on a guided batch and its VAE decode); `framer-ds plan` measures its peak on fake
        tensors, `helpers` being `frozen_helpers() + eval_only_helpers()` and `batch` `example_batch(2)`,
        on the model's device. Nothing by default: evaluation is the training forward without its
        backward, which the training peak already covers."""
        return None


class _DefaultPlanningHooks(PlanningHooks):
    """Every default, for a task that declares no hooks: what the mixin's defaults read (`prepare_data`,
    `build_datasets`, `collate_fn`) comes from the task."""

    def __init__(self, task: Task):
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


def planning_hooks(task: Task) -> PlanningHooks:
    """The planner hooks of `task`: its own where it subclasses `PlanningHooks`, else the defaults."""
    return task if isinstance(task, PlanningHooks) else _DefaultPlanningHooks(task)
