"""The accelerate FSDP rules of the launch pre-flight: every combination that would silently train
unsharded copies, or against the training YAML, is refused before a job queues (facts read from the
accelerate 1.15 sources; docs/distributed.md, "FSDP2").

Why its own module: the DeepSpeed YAML rules (accelerate_yaml_rules.py) and JSON rules
(deepspeed_json_rules.py) have theirs; FSDP fails in its own ways. accelerate reads `fsdp_config` only
under `distributed_type: FSDP`, turns FSDP on only for several GPU-like processes (framer_ds itself
selects it on CPU processes, engine/fsdp2.py), defaults to FSDP1, and drops an auto-wrap policy it cannot
build without a word. Each rule returns every problem it finds, so a user fixes all of them in one edit.
"""

from __future__ import annotations

from framer_ds.config.errors import ConfigProblem
from framer_ds.config.launch_files import Cfg, Problems, mapping_section
from framer_ds.config.launch_files import problem_at as _p
from framer_ds.config.schema import TrainConfig

# FSDP1 keys that FSDP2 does not read (accelerate warns or drops them; NO_SHARD would not shard at all).
FSDP1_ONLY_KEYS = frozenset(
    "fsdp_sharding_strategy fsdp_backward_prefetch fsdp_forward_prefetch fsdp_use_orig_params "  # noqa: SIM905
    "fsdp_sync_module_states".split()
)
EXAMPLE = "configs/accelerate_fsdp2_4gpu.yaml"


def is_fsdp(acc: Cfg) -> bool:
    """The YAML launches FSDP: the rules about its `fsdp_config` apply."""
    return str(acc.get("distributed_type", "")).upper() == "FSDP"


def _total_processes(acc: Cfg) -> int | None:
    processes = acc.get("num_processes", 1)
    return processes if isinstance(processes, int) and not isinstance(processes, bool) else None


def check_fsdp_config(
    acc: Cfg, src: str, train: TrainConfig | None, base_precision: str = "full"
) -> Problems:
    """Every FSDP problem of an accelerate YAML (with the launch flags merged in); `base_precision` is the
    run's model.base_precision."""
    section = mapping_section(acc, "fsdp_config")
    if not is_fsdp(acc):
        if not section:
            return []
        msg = (
            f"is {acc.get('distributed_type')!r}, so accelerate ignores fsdp_config and every process trains "
            f"an unsharded copy; set distributed_type: FSDP (see {EXAMPLE}) or delete fsdp_config"
        )
        return [_p(src, "distributed_type", msg)]
    return (
        fsdp_lever_problems(base_precision)
        + _fallback_problems(acc, src, section)
        + _fsdp2_key_problems(src, section)
        + _train_yaml_problems(src, section, train)
    )


def _fallback_problems(acc: Cfg, src: str, section: Cfg) -> Problems:
    """Launches under which accelerate quietly trains without FSDP."""
    out = []
    version = section.get("fsdp_version", 1)
    if str(version) != "2":
        default = " (accelerate defaults to 1)" if "fsdp_version" not in section else ""
        msg = (
            f"is {version!r}{default}; framer_ds runs FSDP2 only (per-parameter DTensor shards, sharded "
            "checkpoints): set fsdp_version: 2"
        )
        out.append(_p(src, "fsdp_config.fsdp_version", msg))
    if acc.get("use_cpu") is True:
        msg = (
            "true contradicts FSDP: `use_cpu`/--cpu makes accelerate drop FSDP silently; delete it "
            "(without a GPU framer_ds runs FSDP2 on CPU processes over gloo, "
            "configs/accelerate_fsdp2_cpu_2proc.yaml)"
        )
        out.append(_p(src, "use_cpu", msg))
    processes = _total_processes(acc)
    if processes == 1:
        msg = (
            "is 1: accelerate enables FSDP only for several processes, so one process trains unsharded; "
            "launch 2 or more (or use configs/accelerate_1gpu.yaml for one GPU)"
        )
        out.append(_p(src, "num_processes", msg))
    if mapping_section(acc, "deepspeed_config"):
        msg = "is ignored under distributed_type FSDP; delete it (ZeRO and FSDP2 are alternatives)"
        out.append(_p(src, "deepspeed_config", msg))
    return out


def _fsdp2_key_problems(src: str, section: Cfg) -> Problems:
    """Keys FSDP2 does not read, and an auto-wrap policy accelerate would drop."""
    out = [
        _p(
            src,
            f"fsdp_config.{key}",
            "is an FSDP1 setting that FSDP2 does not read; delete it (fsdp_reshard_after_forward: false "
            "keeps parameters gathered between forward and backward, like ZeRO-2)",
        )
        for key in sorted(section)
        if key in FSDP1_ONLY_KEYS
    ]
    policy = str(section.get("fsdp_auto_wrap_policy", "")).upper()
    if policy == "SIZE_BASED_WRAP" and not section.get("fsdp_min_num_params"):
        msg = (
            "is SIZE_BASED_WRAP without fsdp_min_num_params, which accelerate drops silently (the whole "
            "model becomes one unit, gathered whole in every forward); use TRANSFORMER_BASED_WRAP (the "
            "task names its repeated block) or set fsdp_min_num_params"
        )
        out.append(_p(src, "fsdp_config.fsdp_auto_wrap_policy", msg))
    state_dict = str(section.get("fsdp_state_dict_type", "SHARDED_STATE_DICT")).upper()
    if state_dict != "SHARDED_STATE_DICT":
        msg = (
            f"is {state_dict}; framer_ds checkpoints are sharded (torch.distributed.checkpoint: each rank "
            "writes its shard, and they load at another number of processes), while final/ and best/ are "
            "gathered whole anyway: set SHARDED_STATE_DICT"
        )
        out.append(_p(src, "fsdp_config.fsdp_state_dict_type", msg))
    return out


def _train_yaml_problems(src: str, section: Cfg, train: TrainConfig | None) -> Problems:
    """What the training YAML decides (precision, checkpointing), said differently here."""
    if train is None:
        return []
    out = []
    if section.get("fsdp_activation_checkpointing") is True and train.gradient_checkpointing:
        msg = (
            "is true and train.gradient_checkpointing is true: every block would be recomputed twice; the "
            "training YAML decides: delete this key"
        )
        out.append(_p(src, "fsdp_config.fsdp_activation_checkpointing", msg))
    if "fsdp_mixed_precision_policy" in section:
        msg = (
            "is set here, but train.mixed_precision is the one source of precision (it becomes FSDP2's "
            f"MixedPrecisionPolicy, now {train.mixed_precision!r}); delete this key"
        )
        out.append(_p(src, "fsdp_config.fsdp_mixed_precision_policy", msg))
    return out


def fsdp_lever_problems(base_precision: str) -> Problems:
    """Fit levers FSDP2 cannot run (docs/benchmarks.md, "Fit and speed levers")."""
    if base_precision == "full":
        return []
    msg = (
        f"is {base_precision}, but FSDP2 shards every parameter along dim 0 (aten.split), which torchao's "
        "quantized weights do not implement (NotImplementedError, measured with torchao 0.18); use "
        "model.base_precision=full with FSDP2, or the quantized base with plain/DDP training"
    )
    return [ConfigProblem("model.base_precision", msg)]
