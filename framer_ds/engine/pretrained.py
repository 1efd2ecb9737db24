"""One way to load (or freshly build) a model, so the same task code can also build it without weights.

Why: `framer-ds plan` counts parameters exactly and must not read gigabytes of weights (nor need a GPU)
to do it. Tasks load through `load_pretrained` and build fresh models through `build_fresh`; inside
`empty_weights()` both make the same class on the meta device (a checkpoint contributes its config.json
only), and whatever else the task does to the model (widening a conv, peft adapters, resized embeddings)
follows the weights' device, so the census sees the model exactly as training would build it. Only these
two calls change: the built-in tiny models a task creates on first use are still saved with real weights.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

_EMPTY = contextvars.ContextVar("framer_ds_empty_weights", default=False)


@contextmanager
def empty_weights() -> Iterator[None]:
    """`load_pretrained` and `build_fresh` inside make meta-device models and read no weight file."""
    token = _EMPTY.set(True)
    try:
        yield
    finally:
        _EMPTY.reset(token)


def building_empty() -> bool:
    return _EMPTY.get()


def build_fresh(factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """`factory()`, a model built from a config with initialised weights; on the meta device inside
    `empty_weights()` (no memory, no initialisation time)."""
    if not building_empty():
        return factory()
    with torch.device("meta"):
        return factory()


def load_pretrained(
    model_class: Any,
    path: str | Path,
    *,
    subfolder: str | None = None,
    config_overrides: dict[str, Any] | None = None,
    **load_kwargs: Any,
) -> torch.nn.Module:
    """`model_class.from_pretrained(path, ...)`, or inside `empty_weights()` the same architecture built
    from its config only. `config_overrides` change the config (e.g. a new label count); `load_kwargs`
    go to `from_pretrained`, and of them only `attn_implementation` to transformers' `from_config` (the
    rest, like `ignore_mismatched_sizes`, are about reading weights)."""
    overrides = dict(config_overrides or {})
    folder = {"subfolder": subfolder} if subfolder else {}
    if not building_empty():
        return model_class.from_pretrained(path, **folder, **overrides, **load_kwargs)
    if hasattr(model_class, "load_config"):  # diffusers' ModelMixin
        config = {**model_class.load_config(path, **folder), **overrides}
        return build_fresh(lambda: model_class.from_config(config))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, **folder, **overrides)
    model_kwargs = {key: value for key, value in load_kwargs.items() if key == "attn_implementation"}
    build = getattr(model_class, "from_config", None) or model_class._from_config
    return build_fresh(lambda: build(config, **model_kwargs))
