"""The DeepSpeed JSON rules of the launch pre-flight (facts in docs/architecture.md, "Accelerate +
DeepSpeed", read from the accelerate 1.15 / deepspeed 0.19.8 sources).

Why its own module: these rules run twice, before launch (`framer-ds validate`, with the accelerate
YAML's rules) and at training start on the JSON `accelerate launch` put in the environment, so they
stand apart from the YAML rules. Each rule returns every problem it finds, so a user fixes all of them
in one edit.
"""

from __future__ import annotations

from framer_ds.config.errors import did_you_mean
from framer_ds.config.launch_files import Cfg, Problems, mapping_section
from framer_ds.config.launch_files import problem_at as _p
from framer_ds.config.schema import TrainConfig
from framer_ds.config.zero_fields import ZERO_BUFFER_KEYS, is_element_count

# JSON fields the training YAML owns: accelerate fills "auto" from the Accelerator and the DataLoader.
# A missing gradient_accumulation_steps is set to 1 by accelerate, and that 1 then WINS at prepare().
AUTO_FROM_TRAIN: dict[str, str] = {
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.gradient_accumulation_steps",
    "gradient_clipping": "train.optimizer.max_grad_norm",
}


def check_batch_fields_auto(ds: Cfg, src: str) -> Problems:
    """Rule a: batch size, accumulation and clipping come from the training YAML, never the JSON."""
    out = []
    for key, owner in AUTO_FROM_TRAIN.items():
        if key not in ds:
            msg = f'missing; add "{key}": "auto" so {owner} fills it.' + did_you_mean(key, ds)
        elif ds[key] != "auto":
            msg = f'is {ds[key]!r}, which overrides {owner}; set it to "auto" and set {owner} instead'
        else:
            continue
        out.append(_p(src, key, msg))
    if ds.get("train_batch_size", "auto") != "auto":
        msg = 'must be "auto" or absent: it is train.micro_batch_size x accumulation x processes'
        out.append(_p(src, "train_batch_size", f"is {ds['train_batch_size']!r}; {msg}"))
    return out


def check_precision_blocks(ds: Cfg, src: str, train: TrainConfig | None) -> Problems:
    """Rule a: bf16/fp16 `enabled` should be "auto"; an explicit value must agree with the YAML."""
    out, enabled = [], []
    for dtype in ("bf16", "fp16"):
        if dtype not in ds:
            continue  # accelerate adds the block from train.mixed_precision
        if "enabled" not in mapping_section(ds, dtype):
            msg = f'has no "enabled", so {dtype} stays off whatever train.mixed_precision says'
            out.append(_p(src, dtype, msg + '; write {"enabled": "auto"}'))
            continue
        raw = ds[dtype]["enabled"]
        value = raw.lower() == "true" if isinstance(raw, str) and raw.lower() in ("true", "false") else raw
        if value == "auto":
            continue
        if not isinstance(value, bool):
            out.append(_p(src, f"{dtype}.enabled", f'is {raw!r}; use "auto"'))
            continue
        enabled += [dtype] if value else []
        if train is not None and value != (train.mixed_precision == dtype):
            msg = f"is {str(value).lower()} but train.mixed_precision is '{train.mixed_precision}'"
            out.append(_p(src, f"{dtype}.enabled", msg + '; set it to "auto" (the training YAML decides)'))
    if len(enabled) == 2:
        msg = 'both are enabled; set both to "auto" and choose with train.mixed_precision'
        out.append(_p(src, "bf16.enabled, fp16.enabled", msg))
    return out


def check_zero_section(ds: Cfg, src: str) -> Problems:
    """Rule g: accelerate refuses a JSON without zero_optimization; DeepSpeed knows stages 0-3."""
    if not isinstance(ds.get("zero_optimization"), dict):
        msg = 'missing or not an object (accelerate refuses the file); add {"stage": 2}, see zero2.json'
        return [_p(src, "zero_optimization", msg)]
    stage = ds["zero_optimization"].get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        return [_p(src, "zero_optimization.stage", f"is {stage!r}; use an integer 0, 1, 2 or 3")]
    return []


def check_buffer_fields(ds: Cfg, src: str) -> Problems:
    """Rule d: buffer sizes are "auto" (sized from the trained model at start) or an element count;
    DeepSpeed rejects anything else only once the engine is built, after the queue and the model load."""
    zero = mapping_section(ds, "zero_optimization")
    msg = '"auto" (framer_ds sizes it from the trainable parameters) or a whole number of elements'
    return [
        _p(src, f"zero_optimization.{key}", f"is {value!r}; use {msg}")
        for key in ZERO_BUFFER_KEYS
        if key in zero and (value := zero[key]) != "auto" and not is_element_count(value)
    ]


def check_offload_param_stage(ds: Cfg, src: str) -> Problems:
    """Rule e: parameter offload exists only in ZeRO-3; below it the block is a misconfiguration."""
    zero = mapping_section(ds, "zero_optimization")
    device, stage = mapping_section(zero, "offload_param").get("device", "none"), zero.get("stage", 0)
    if device in (None, "none") or not isinstance(stage, int) or stage >= 3:
        return []
    msg = f"device {device!r} needs ZeRO stage 3 (stage is {stage}); use zero3_offload.json or delete it"
    return [_p(src, "zero_optimization.offload_param", msg + " (offload_optimizer works with stage 2)")]


def check_no_optimizer_scheduler(ds: Cfg, src: str) -> Problems:
    """Rule f: framer_ds builds AdamW + the LR schedule in code; a JSON block too makes prepare() raise."""
    why = "framer_ds builds AdamW and the LR schedule from train.* (both -> ValueError in accelerate;"
    why += " with offload accelerate swaps in DeepSpeedCPUAdam itself)"
    return [
        _p(src, block, f"delete the {block} block: {why}")
        for block in ("optimizer", "scheduler")
        if block in ds
    ]


def check_train_levers(
    ds: Cfg, src: str, train: TrainConfig | None, base_precision: str = "full"
) -> Problems:
    """Fit and speed levers (`train:`, model.base_precision) that DeepSpeed cannot run (docs/benchmarks.md,
    "Fit and speed levers", says what was tried on deepspeed 0.19.8)."""
    out = []
    if base_precision != "full":
        msg = (
            f"model.base_precision is {base_precision}, but DeepSpeed moves and casts the whole module with "
            "Module._apply, which cannot swap torchao's quantized weights (\"_apply(): Couldn't swap "
            'Linear.weight", measured with ZeRO-2 and ZeRO-3); use model.base_precision=full here, or the '
            "quantized base with plain/DDP training"
        )
        out.append(_p(src, "zero_optimization", msg))
    if train is None:
        return out
    if train.optimizer.name == "adamw_8bit":
        msg = (
            "train.optimizer.name is adamw_8bit, but DeepSpeed's ZeRO optimizer owns the optimizer states "
            "(fp32, on its flat partitions): it refuses an optimizer it does not know (zero_allow_untested_"
            "optimizer) and with offload_optimizer accelerate swaps in DeepSpeedCPUAdam, dropping the 8-bit "
            "states silently; use train.optimizer.name=adamw here, or adamw_8bit with DDP or FSDP2"
        )
        out.append(_p(src, "zero_optimization", msg))
    if train.compile and mapping_section(ds, "zero_optimization").get("stage") == 3:
        msg = (
            "is 3 and train.compile is true: ZeRO-3 gathers each parameter in a hook dynamo cannot trace, so "
            "every compiled block breaks into pieces around them; the losses match eager but steps ran ~6x "
            "slower (measured on CPU, the quickstart ViT) after a ~100 s compile. Set train.compile=false "
            "under ZeRO-3, or use ZeRO-2 or FSDP2 with compile"
        )
        out.append(_p(src, "zero_optimization.stage", msg))
    return out


def check_deepspeed_json(
    ds: Cfg, src: str, train: TrainConfig | None, base_precision: str = "full"
) -> Problems:
    """Every DeepSpeed JSON rule, all problems at once; `base_precision` is the run's model.base_precision."""
    return [
        *check_zero_section(ds, src),
        *check_batch_fields_auto(ds, src),
        *check_precision_blocks(ds, src, train),
        *check_buffer_fields(ds, src),
        *check_offload_param_stage(ds, src),
        *check_no_optimizer_scheduler(ds, src),
        *check_train_levers(ds, src, train, base_precision),
    ]
