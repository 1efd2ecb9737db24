"""Library versions and optional packages, in one place.

An optional package missing, or installed but broken (torchvision built for another torch fails on
import with "operator torchvision::nms does not exist"), used to surface as a traceback deep inside the
library that needed it. `require` names the package, what needs it and how to install it, at the
point of use, so a run that does not need it never fails for it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

INSTALL = {
    "av": "av>=12",
    "wandb": "wandb>=0.19",
    "tensorboard": "tensorboard>=2.15",
    "snac": "snac>=1.2",
    "soundfile": "soundfile>=0.12",
    "datasets": "datasets>=2.19",
    "torchvision": "torchvision",
    "pocketsphinx": "pocketsphinx>=5.0",
    "resemblyzer": "resemblyzer>=0.1.4",
    "webrtcvad": "webrtcvad>=2.0.10",
}


class MissingDependencyError(RuntimeError):
    """An optional package a feature needs is missing or does not load; the message says how to fix it.
    The CLI prints it and exits 1."""


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` for `purpose` (e.g. "W&B logging (log.wandb)"), or raise MissingDependencyError."""
    spec = INSTALL.get(module.split(".")[0], module)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"package {spec.split('>')[0]} is required for {purpose}; install it with "
            f"`pip install '{spec}'` (import failed: {exc})"
        ) from exc
    except (RuntimeError, OSError, AttributeError) as exc:
        raise MissingDependencyError(
            f"package {spec.split('>')[0]} is installed but does not load ({type(exc).__name__}: {exc}); it "
            f"is needed for {purpose}. It was probably built for another torch or Python: reinstall it to "
            f"match (`pip install --force-reinstall '{spec}'`), or uninstall it if nothing needs it."
        ) from exc


class LazyModule:
    """A module imported with `require` on first use: `av = LazyModule("av", "video data")` at the top of
    a module keeps importing that module cheap and possible without the package, and a run that reads
    no video never needs it."""

    def __init__(self, module: str, purpose: str):
        self._module, self._purpose = module, purpose

    def __getattr__(self, name: str):
        return getattr(require(self._module, self._purpose), name)


def check_torchvision() -> None:
    """transformers imports torchvision whenever it is installed, from its core modules (even the LR
    schedulers); PyPI's torchvision next to another torch build then fails on import ("operator
    torchvision::nms does not exist") and every framer-ds command would die in a traceback. framer_ds
    does not use torchvision itself, so a broken one is named once, up front, with the fix."""
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        importlib.import_module("torchvision")
    except (ImportError, RuntimeError, OSError, AttributeError) as exc:
        raise MissingDependencyError(
            f"torchvision is installed but does not load ({type(exc).__name__}: {exc}); transformers "
            "imports it whenever it is installed. framer_ds does not need torchvision: uninstall it "
            "(`pip uninstall torchvision`), or install the build that matches your torch."
        ) from exc


def image_processor_class(name: str) -> type:
    """transformers >= 5 names its torchvision-free processors `<Name>Pil` and warns on stderr when the
    plain name falls back to it; older versions only have the plain name."""
    import transformers

    try:
        return getattr(transformers, f"{name}Pil")
    except (AttributeError, ImportError):
        return getattr(transformers, name)


def fix_processor_class(folder: Path, component: str = "feature_extractor") -> None:
    """Name `component` `CLIPImageProcessor` in the diffusers folder's model_index.json (the tiny bases
    built for tests and demos): without torchvision, transformers hands back `CLIPImageProcessorPil`,
    which `save_pretrained` records; the real repos name `CLIPImageProcessor`, which resolves to
    whichever backend the loading machine has (`image_processor_class` is the loading side)."""
    index_path = Path(folder) / "model_index.json"
    index = json.loads(index_path.read_text())
    index[component] = ["transformers", "CLIPImageProcessor"]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
