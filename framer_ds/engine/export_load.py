"""An export's weights (`final/`, `best/`) back into the model a task's `build_model` made: what
`framer-ds eval RUN` evaluates.

Why into that model rather than evaluating whatever `from_pretrained(final)` returns: the model to
evaluate is the one training built (same class, same peft wrapping, same attention settings), so the
eval forward is training's; only its weights come from the export (a transformers model's read by its
own loader, which knows how its files name them). Every problem (a missing file, keys or shapes that do
not fit) is one line naming the export and the fix, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from framer_ds.config.errors import ConfigError, ConfigProblem

WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _problem(export_dir: Path, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(str(export_dir), message)], "eval")


def _does_not_fit(export_dir: Path, only_export: list[str], only_model: list[str]) -> ConfigError:
    return _problem(
        export_dir,
        f"the export does not fit the recorded config's model (keys only in the export: "
        f"{only_export[:3]}, only in the model: {only_model[:3]}); re-export the run",
    )


def read_export_weights(export_dir: Path, name: str) -> dict[str, torch.Tensor]:
    path = Path(export_dir) / name
    if not path.is_file():
        raise _problem(export_dir, f"no {name} here: pass a finished run (its final/ or best/ holds it)")
    return load_file(str(path))


def load_full_export(model: torch.nn.Module, export_dir: Path, name: str = WEIGHTS) -> None:
    """Every weight of `model` from the export; a key only one of them has is an error.

    A transformers model goes through its own `from_pretrained`: transformers renames weights between
    the file and the module (v5 converts legacy checkpoint names) and writes a tied weight once, so only
    its loader reads its files right; the values are then copied into `model`. Any other module reads
    the safetensors file `name` directly."""
    from transformers import PreTrainedModel

    export_dir = Path(export_dir)
    if isinstance(model, PreTrainedModel):
        if not (export_dir / "config.json").is_file():
            raise _problem(export_dir, "no config.json here: pass a finished run (its final/ or best/)")
        loaded, info = type(model).from_pretrained(export_dir, config=model.config, output_loading_info=True)
        mismatched = [str(key[0] if isinstance(key, tuple) else key) for key in info["mismatched_keys"]]
        if info["unexpected_keys"] or info["missing_keys"] or mismatched:
            raise _does_not_fit(
                export_dir, sorted(info["unexpected_keys"]), sorted(info["missing_keys"]) + mismatched
            )
        state = loaded.state_dict()
    else:
        state = read_export_weights(export_dir, name)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shapes differ: the export is not of this architecture
        first = str(exc).strip().splitlines()[-1].strip()
        raise _problem(export_dir, f"the export does not fit the recorded config's model ({first})") from None
    if result.unexpected_keys or result.missing_keys:
        raise _does_not_fit(export_dir, result.unexpected_keys, result.missing_keys)


def load_peft_adapter(model: torch.nn.Module, export_dir: Path) -> None:
    """A peft adapter export (`adapter_model.safetensors`, with its `modules_to_save`) into the peft
    model `build_model` made. peft writes a resized embedding or head of `modules_to_save` twice (as
    `<module>.weight` and as `<module>.modules_to_save.weight`); it loads the first and reports the
    second as unexpected, which is no problem where the two are the same tensor."""
    from peft import set_peft_model_state_dict

    adapter = read_export_weights(export_dir, ADAPTER_WEIGHTS)
    result = set_peft_model_state_dict(model, adapter)
    unexpected = []
    for key in result.unexpected_keys:
        loaded_as = key.replace(".modules_to_save.", ".")
        if loaded_as == key or loaded_as not in adapter or not torch.equal(adapter[key], adapter[loaded_as]):
            unexpected.append(key)
    if unexpected:
        raise _problem(export_dir, f"adapter keys the model lacks: {unexpected[:5]}")
