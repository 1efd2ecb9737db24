"""Console lines from the libraries underneath that tell a framer_ds user nothing they can act on.

Where the cause is ours, it is fixed at the cause; what is left is filtered here, each by the
logger or warning category it comes from AND its message, never a whole logger or category:

- DeepSpeed's "Setting accelerator to CPU. If you have GPU ... we were unable to detect it": on a
  machine without CUDA framer_ds trains on the CPU on purpose. We tell DeepSpeed so
  (`DS_ACCELERATOR=cpu`, unless the user set it), which is the detection's own override, and the
  warning is not printed; a CUDA machine is left to DeepSpeed's detection.
- transformers' "`CLIPImageProcessor` requires torchvision (not installed); falling back to
  `CLIPImageProcessorPil`": raised when diffusers' SVD pipeline module imports the plain name.
  framer_ds itself asks for the Pil class (`compat.image_processor_class`); the fallback is the
  class we want.
- diffusers' "There are modules in X that should be kept in float32: []": diffusers >= 0.36 warns on
  every `.to(dtype)` of a model, even one with no float32 modules (the empty list). A model that does
  list modules still warns.
- torchao's "Failed to load .../torchao/_C_*.so: Could not load this library" (its CUDA kernels, which a
  CPU build of torch cannot load; the int8 weight-only path framer_ds uses needs none of them), torch's
  "<enum ...> is an Enum subclass and is now natively supported by torch.compile" (torchao registers its
  enums the old way at import) and diffusers' "Unable to import `torchao` Tensor objects" (its loader
  for checkpoints that diffusers serialised with torchao, which framer_ds never reads): printed by every
  command once torchao (`model.base_precision: int8`) is installed.
- torch's FSDP2 UserWarning "FSDP2-wrapped module (FSDPViTPatchEmbeddings) returned a view tensor. An
  in-place op on this view ... will silently drop the pre-backward hook": accelerate shards a model's
  input embedding as a unit of its own, and transformers' ViT patch embedding returns
  `flatten(2).transpose(1, 2)`, a view, which ViTEmbeddings only ever reads out of place (`torch.cat`,
  `+`), so no hook is dropped: the FSDP2 ViT runs give DDP's losses (tests/engine/test_fsdp2.py).
  Printed twice per step on every rank of every FSDP2 ViT run. The same for the root `FSDPPeftModel`
  of a Wan LoRA run (diffusers' WanTransformer3DModel returns its output as a reshape/permute view):
  that output goes only to framer_ds's own flow-matching loss and sampler, which read it out of place,
  and the FSDP2 Wan run's adapter and samples equal DDP's bit for bit
  (tests/tasks/video_lora/wan/test_wan_family.py). The same warning for any other module still shows.
- torch >= 2.10's FutureWarnings that `all_gather_into_tensor` / `reduce_scatter_tensor` (and their
  private `_base` forms) are deprecated: called by DeepSpeed's and accelerate's collectives, not by
  framer_ds.

Progress bars of the libraries' own loading and saving (transformers' "Loading weights" and "Writing model
shards", one per component: a Wan sample printed two before its own bar; diffusers' "Loading checkpoint
shards" and pipeline bars) are switched off by `quiet_loading_bars`, which the commands that load models
call (`train`, `sample`, `export`, `eval`, `smoke`): framer_ds shows its own progress (training steps,
sampling steps). A library not imported yet is switched off as it is imported, not imported for it:
importing diffusers (it pulls torch._dynamo) and transformers cost every rank of every `framer-ds train`
~2.5 s of CPU, for tasks that use neither (the ViT uses transformers only; the test suite's MLP, neither).
Download bars (huggingface_hub's) stay: a multi-GB download says how far it is.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType

_LOG_FILTERS = {
    "transformers.utils.import_utils": re.compile(r"requires torchvision \(not installed\); falling back"),
    "diffusers.models.modeling_utils": re.compile(r"should be kept in float32: \[\]\."),
    "torchao": re.compile(r"^Failed to load .*torchao/_C\w*\..*\.so: "),
    "torch.utils._pytree": re.compile(r"is an Enum subclass and is now natively supported by torch\.compile"),
    "diffusers.quantizers.torchao.torchao_quantizer": re.compile(r"^Unable to import `torchao` Tensor"),
}
_DEPRECATED_COLLECTIVES = (
    r"`torch\.distributed\.(all_gather_into_tensor|_all_gather_base|reduce_scatter_tensor"
    r"|_reduce_scatter_base)` is (deprecated|a private function)"
)

_KNOWN_VIEW_OUTPUTS = (
    r"FSDP2-wrapped module \((FSDPViTPatchEmbeddings|FSDPPeftModel)\) returned a view tensor"
)


class _DropMessage(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_third_party_noise() -> None:
    """Install the filters above (idempotent); call before the libraries are imported."""
    if "DS_ACCELERATOR" not in os.environ and not _cuda_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    for name, pattern in _LOG_FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.pattern is pattern for f in logger.filters):
            logger.addFilter(_DropMessage(pattern))
    warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVES, category=FutureWarning)
    warnings.filterwarnings("ignore", message=_KNOWN_VIEW_OUTPUTS, category=UserWarning)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def quiet_loading_bars() -> None:
    """Switch off transformers' and diffusers' own progress bars (module docstring), not the hub's: at once
    where the library is imported, else right after its logging module is first executed."""
    for name, switch_off in _BAR_SWITCHES.items():
        if name in sys.modules:
            switch_off(sys.modules[name])
        elif not any(isinstance(f, _SwitchOffOnImport) and f.name == name for f in sys.meta_path):
            sys.meta_path.insert(0, _SwitchOffOnImport(name, switch_off))


class _SwitchOffOnImport(importlib.abc.MetaPathFinder):
    """Finds module `name` as the other finders do, and has its loader call `switch_off(module)` once the
    module has executed (its functions defined), before anything can make a bar with it."""

    def __init__(self, name: str, switch_off: Callable[[ModuleType], None]):
        self.name, self.switch_off = name, switch_off

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = _then(
                    spec.loader.exec_module, self.switch_off
                )  # this spec's loader
                return spec
        return None


def _then(execute: Callable[[ModuleType], None], switch_off: Callable[[ModuleType], None]):
    def exec_module(module: ModuleType) -> None:
        execute(module)
        switch_off(module)

    return exec_module


def _disabled_bar(factory, args, kwargs):
    """transformers' tqdm hook: the bar it would make, disabled (iterating it still yields every item)."""
    return factory(*args, **{**kwargs, "disable": True})


_BAR_SWITCHES: dict[str, Callable[[ModuleType], None]] = {
    "transformers.utils.logging": lambda logging_module: logging_module.set_tqdm_hook(_disabled_bar),
    "diffusers.utils.logging": lambda logging_module: logging_module.disable_progress_bar(),
}
