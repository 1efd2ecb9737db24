"""Pre-flight cross-checks: training YAML x accelerate YAML x DeepSpeed JSON (the facts are in
docs/architecture.md, "Accelerate + DeepSpeed").

Each rule is one small function returning every problem it finds, so a user fixes all of them in one
edit. Nothing heavy is imported (no torch, no accelerate, no model): `framer-ds validate` runs in a
second, and the JSON rules run again at training start from what `accelerate launch` put in the
environment. The facts encoded here were read from the accelerate 1.15 / deepspeed 0.19.8 sources.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from framer_ds.config.errors import ConfigProblem, did_you_mean
from framer_ds.config.schema import TrainConfig
from framer_ds.config.zero_fields import ZERO_BUFFER_KEYS, fixed_bucket_warning, is_element_count

Problems = list[ConfigProblem]
Cfg = Mapping[str, Any]

# JSON fields the training YAML owns: accelerate fills "auto" from the Accelerator and the DataLoader.
# A missing gradient_accumulation_steps is set to 1 by accelerate, and that 1 then WINS at prepare().
AUTO_FROM_TRAIN: dict[str, str] = {
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.gradient_accumulation_steps",
    "gradient_clipping": "train.max_grad_norm",
}
# Keys DeepSpeedPlugin._deepspeed_config_checks rejects ("will be ignored") next to a JSON file.
# `accelerate launch` also adds the YAML's top-level mixed_precision, even 'no'. zero3_init_flag is fine.
IGNORED_WITH_CONFIG_FILE = frozenset(
    "gradient_accumulation_steps gradient_clipping zero_stage offload_optimizer_device "  # noqa: SIM905
    "offload_param_device offload_param_nvme_path offload_optimizer_nvme_path zero3_save_16bit_model "
    "mixed_precision".split()
)
# accelerate's ClusterConfig fields plus legacy fp16/dynamo_backend; any other key makes launch raise.
ACCELERATE_YAML_KEYS = frozenset(
    "compute_environment distributed_type mixed_precision use_cpu debug num_processes machine_rank "  # noqa: SIM905
    "num_machines gpu_ids main_process_ip main_process_port rdzv_backend same_network "
    "main_training_function enable_cpu_affinity fp8_config deepspeed_config fsdp_config "
    "parallelism_config megatron_lm_config mpirun_config downcast_bf16 tpu_name tpu_zone "
    "tpu_use_cluster tpu_use_sudo command_file commands tpu_vm tpu_env dynamo_config fp16 "
    "dynamo_backend".split()
)
_DS_FILE = "deepspeed_config.deepspeed_config_file"


def _p(src: str, key: str, message: str) -> ConfigProblem:
    return ConfigProblem(f"{src}: {key}" if key else src, message)


def _load(path: Path, kind: str) -> tuple[dict[str, Any] | None, Problems]:
    """Read a JSON/YAML mapping; a missing file or syntax error becomes a problem, not a traceback."""
    if not path.is_file():
        return None, [_p(str(path), "", "file not found; check the path (relative to where you launch)")]
    try:
        text = path.read_text()
        data = json.loads(text) if kind == "JSON" else (yaml.safe_load(text) or {})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        hint = " (JSON allows no comments or trailing commas)" if kind == "JSON" else ""
        return None, [_p(str(path), "", f"cannot read {kind}: {exc}; fix the syntax{hint}")]
    if not isinstance(data, dict):
        return None, [_p(str(path), "", f"top level must be a mapping, got {type(data).__name__}")]
    return data, []


def load_json_config(path: Path) -> tuple[dict[str, Any] | None, Problems]:
    """A DeepSpeed JSON as a dict, or None plus the parser's complaint."""
    return _load(Path(path), "JSON")


def load_yaml_file(path: Path) -> tuple[dict[str, Any] | None, Problems]:
    """An accelerate YAML as a dict, or None plus the parser's complaint."""
    return _load(Path(path), "YAML")


def _section(cfg: Cfg, key: str) -> dict[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}


# --- DeepSpeed JSON rules -------------------------------------------------------------------------


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
        if "enabled" not in _section(ds, dtype):
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
    zero = _section(ds, "zero_optimization")
    msg = '"auto" (framer_ds sizes it from the trainable parameters) or a whole number of elements'
    return [
        _p(src, f"zero_optimization.{key}", f"is {value!r}; use {msg}")
        for key in ZERO_BUFFER_KEYS
        if key in zero and (value := zero[key]) != "auto" and not is_element_count(value)
    ]


def check_offload_param_stage(ds: Cfg, src: str) -> Problems:
    """Rule e: parameter offload exists only in ZeRO-3; below it the block is a misconfiguration."""
    zero = _section(ds, "zero_optimization")
    device, stage = _section(zero, "offload_param").get("device", "none"), zero.get("stage", 0)
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


def check_deepspeed_json(ds: Cfg, src: str, train: TrainConfig | None) -> Problems:
    """Every DeepSpeed JSON rule, all problems at once."""
    return [
        *check_zero_section(ds, src),
        *check_batch_fields_auto(ds, src),
        *check_precision_blocks(ds, src, train),
        *check_buffer_fields(ds, src),
        *check_offload_param_stage(ds, src),
        *check_no_optimizer_scheduler(ds, src),
    ]


# --- accelerate YAML rules ------------------------------------------------------------------------


def _is_deepspeed(acc: Cfg) -> bool:
    return str(acc.get("distributed_type", "")).upper() == "DEEPSPEED"


def check_accelerate_keys(acc: Cfg, src: str) -> Problems:
    """accelerate launch raises on unknown top-level keys; catch the typo before a job queues."""
    msg = "unknown accelerate config key (accelerate launch would raise); delete or fix it."
    return [
        _p(src, k, msg + did_you_mean(k, ACCELERATE_YAML_KEYS)) for k in acc if k not in ACCELERATE_YAML_KEYS
    ]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_accelerate_counts(acc: Cfg, src: str) -> Problems:
    """Process and machine counts, the machine rank, the port and the GPU list: values accelerate would
    take as they are and fail on at launch (num_processes 0), or misread (gpu_ids for fewer GPUs)."""
    out = []
    for key in ("num_processes", "num_machines"):
        if key in acc and not _positive_int(acc[key]):
            out.append(_p(src, key, f"is {acc[key]!r}; it must be a whole number >= 1"))
    machines = acc.get("num_machines", 1) if _positive_int(acc.get("num_machines", 1)) else None
    rank = acc.get("machine_rank", 0)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        out.append(_p(src, "machine_rank", f"is {rank!r}; it must be a whole number >= 0"))
    elif machines is not None and rank >= machines:
        msg = f"is {rank} but num_machines is {machines}: machine ranks run 0..{machines - 1}"
        out.append(_p(src, "machine_rank", msg))
    port = acc.get("main_process_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        out.append(_p(src, "main_process_port", f"is {port!r}; use a free TCP port, e.g. 29500"))
    gpu_ids, processes = acc.get("gpu_ids"), acc.get("num_processes")
    if gpu_ids is not None and str(gpu_ids).strip().lower() != "all":
        ids = [part.strip() for part in str(gpu_ids).split(",") if part.strip()]
        if not ids or not all(part.isdigit() for part in ids):
            out.append(
                _p(src, "gpu_ids", f"is {gpu_ids!r}; write 'all' or a comma list of GPU indices, e.g. 0,1")
            )
        elif len(set(ids)) != len(ids):
            out.append(_p(src, "gpu_ids", f"is {gpu_ids!r}; a GPU is listed twice"))
        elif _positive_int(processes) and machines and len(ids) != processes // machines:
            msg = (
                f"lists {len(ids)} GPU(s) but num_processes {processes} over {machines} machine(s) starts "
                f"{processes // machines} per machine; make them agree (or write gpu_ids: all)"
            )
            out.append(_p(src, "gpu_ids", msg))
    if _positive_int(processes) and machines and processes % machines:
        msg = f"{processes} does not split evenly over num_machines {machines}; use a multiple of it"
        out.append(_p(src, "num_processes", msg))
    return out + check_multi_machine_rendezvous(acc, src)


def uses_deepspeed_runner(acc: Cfg) -> bool:
    """Several machines under DeepSpeed with a launcher other than `standard`: accelerate hands the job to
    DeepSpeed's own runner, which reads `deepspeed_hostfile` and reaches every host itself (pdsh/ssh)."""
    launcher = _section(acc, "deepspeed_config").get("deepspeed_multinode_launcher", "pdsh")
    machines = acc.get("num_machines", 1)
    return _is_deepspeed(acc) and _positive_int(machines) and machines > 1 and launcher != "standard"


def check_multi_machine_rendezvous(acc: Cfg, src: str) -> Problems:
    """Static rendezvous over several machines needs the head node's address on every node: accelerate
    passes the literal string 'None' to torchrun otherwise, and each node waits for a head that never
    answers."""
    machines = acc.get("num_machines", 1)
    if not _positive_int(machines) or machines == 1 or uses_deepspeed_runner(acc):
        return []
    if acc.get("main_process_ip") in (None, ""):
        msg = (
            f"is missing but num_machines is {machines}: every node must name the head node; pass "
            "--main_process_ip HEAD to accelerate launch and --main-process-ip HEAD to framer-ds validate "
            "(slurm/train_multinode.sh and scripts/train/launch.sh do both)"
        )
        return [_p(src, "main_process_ip", msg)]
    return []


def check_accelerate_precision(acc: Cfg, src: str, train: TrainConfig | None) -> Problems:
    """Rule b: the training YAML picks precision; an accelerate YAML saying otherwise misleads."""
    value = acc.get("mixed_precision")
    if train is None or value in (None, "no", train.mixed_precision):
        return []
    msg = f"is {value!r} but train.mixed_precision is '{train.mixed_precision}'; the training YAML decides:"
    return [_p(src, "mixed_precision", msg + " set train.mixed_precision and delete this key")]


def check_ignored_with_config_file(acc: Cfg, src: str, json_in_use: bool) -> Problems:
    """Rule c: next to a DeepSpeed JSON these keys make DeepSpeedPlugin raise ("will be ignored")."""
    if not json_in_use or not _is_deepspeed(acc):
        return []
    why = "is not allowed next to a DeepSpeed JSON (accelerate raises 'will be ignored')"
    out = [
        _p(src, f"deepspeed_config.{key}", f"{why}; move it into the JSON / training YAML, delete it here")
        for key in _section(acc, "deepspeed_config")
        if key.lower() in IGNORED_WITH_CONFIG_FILE
    ]
    if "mixed_precision" in acc:
        msg = f"{why}, even as 'no'; delete it: train.mixed_precision fills the JSON's \"auto\" precision"
        out.append(_p(src, "mixed_precision", msg))
    return out


def check_plugin_values_match_train(acc: Cfg, src: str, train: TrainConfig | None) -> Problems:
    """Without a JSON, deepspeed_config.gradient_* become env vars that silently beat the training YAML."""
    section = _section(acc, "deepspeed_config")
    if train is None or not _is_deepspeed(acc) or "deepspeed_config_file" in section:
        return []
    wanted = {
        "gradient_accumulation_steps": ("gradient_accumulation_steps", train.gradient_accumulation_steps)
    }
    wanted["gradient_clipping"] = ("max_grad_norm", train.max_grad_norm)
    return [
        _p(
            src,
            f"deepspeed_config.{key}",
            f"is {section[key]!r} but train.{owner} is {want!r}; it wins: delete it",
        )
        for key, (owner, want) in wanted.items()
        if key in section and section[key] != want
    ]


def check_deepspeed_source(acc: Cfg, src: str, explicit_json: bool) -> Problems:
    """Rule h: DeepSpeed needs a JSON or a zero_stage; a JSON is ignored unless the YAML says DEEPSPEED."""
    section = _section(acc, "deepspeed_config")
    if not _is_deepspeed(acc):
        if not explicit_json:
            return []
        msg = f"is {acc.get('distributed_type')!r}, so accelerate ignores --deepspeed_config_file;"
        return [_p(src, "distributed_type", msg + " use a DEEPSPEED YAML, e.g. configs/accelerate_4gpu.yaml")]
    out = []
    if not explicit_json and "deepspeed_config_file" not in section and "zero_stage" not in section:
        msg = "DEEPSPEED with neither deepspeed_config_file nor zero_stage; add deepspeed_config_file: "
        out.append(_p(src, "deepspeed_config", msg + "configs/deepspeed/zero2.json"))
    if acc.get("use_cpu") is True:
        msg = (
            "true contradicts DEEPSPEED: accelerate's DeepSpeed launcher ignores it, and --cpu silently "
            "drops DeepSpeed; delete use_cpu (DeepSpeed uses its CPU accelerator when no GPU is visible)"
        )
        out.append(_p(src, "use_cpu", msg))
    return out


def _resolve_json(name: str, yaml_path: Path, src: str) -> tuple[Path | None, Problems]:
    """accelerate opens the path from the launch directory; the YAML's own directory is a fallback."""
    path, beside = Path(name), yaml_path.parent / name
    if path.is_file():
        return path, []
    if not path.is_absolute() and beside.is_file():
        msg = f"{name!r} exists only next to the YAML, but accelerate opens it from where you launch;"
        return beside, [_p(src, _DS_FILE, msg + f" write {str(beside)!r} (repo-root relative) or absolute")]
    msg = f"{name!r} not found in {Path.cwd()} nor in {yaml_path.parent}; fix the path (repo-root relative)"
    return None, [_p(src, _DS_FILE, msg)]


def check_launch_configs(
    train: TrainConfig | None,
    accelerate_config: Path | None = None,
    deepspeed_config: Path | None = None,
    launch_flags: Mapping[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> list[ConfigProblem]:
    """Every problem across the three configs; `deepspeed_config` mirrors --deepspeed_config_file and
    `launch_flags` the `accelerate launch` flags that beat the YAML's keys (num_processes, num_machines,
    machine_rank, main_process_ip, main_process_port). Costly but legal choices (a fixed 5e8 bucket) are
    appended to `warnings` when given."""
    problems: Problems = []
    json_path = Path(deepspeed_config) if deepspeed_config is not None else None
    if accelerate_config is not None:
        acc, problems = load_yaml_file(Path(accelerate_config))
        if acc is not None:
            acc = {**acc, **(launch_flags or {})}
            src, explicit = str(accelerate_config), json_path is not None
            yaml_json = _section(acc, "deepspeed_config").get("deepspeed_config_file")
            problems += check_accelerate_keys(acc, src)
            problems += check_accelerate_counts(acc, src)
            problems += check_accelerate_precision(acc, src, train)
            problems += check_ignored_with_config_file(acc, src, explicit or bool(yaml_json))
            problems += check_plugin_values_match_train(acc, src, train)
            problems += check_deepspeed_source(acc, src, explicit)
            if not explicit and yaml_json and _is_deepspeed(acc):
                json_path, found = _resolve_json(str(yaml_json), Path(accelerate_config), src)
                problems += found
    if json_path is not None:
        ds, load_problems = load_json_config(json_path)
        problems += load_problems
        if ds is not None:
            problems += check_deepspeed_json(ds, str(json_path), train)
            mixed = train.mixed_precision if train is not None else "no"
            warning = fixed_bucket_warning(_section(ds, "zero_optimization"), mixed)
            if warnings is not None and warning is not None:
                warnings.append(f"{json_path}: zero_optimization.{warning}")
    return problems


# --- runtime (inside `accelerate launch`) -----------------------------------------------------------


def _env_overrides(env: Mapping[str, str], train: TrainConfig) -> Problems:
    """Precision/accumulation/clipping that `accelerate launch` flags or YAML keys set against the YAML."""
    out, mixed = [], env.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if mixed in ("bf16", "fp16") and train.mixed_precision not in ("no", mixed):
        msg = f"is {mixed!r} but train.mixed_precision is {train.mixed_precision!r}; drop --mixed_precision"
        out.append(_p("environment", "ACCELERATE_MIXED_PRECISION", msg + " and the accelerate YAML's key"))
    for var, owner, want in (
        (
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
            "gradient_accumulation_steps",
            train.gradient_accumulation_steps,
        ),
        ("ACCELERATE_GRADIENT_CLIPPING", "max_grad_norm", train.max_grad_norm),
    ):
        value = env.get(var, "auto")
        if value != "auto" and value != str(want) and value != str(float(want)):
            msg = f"is {value} but train.{owner} is {want}; accelerate's value wins: drop the flag / YAML key"
            out.append(_p("environment", var, msg))
    return out


def check_runtime_environment(train: TrainConfig) -> list[ConfigProblem]:
    """The same checks at training start, from the env vars accelerate's DeepSpeed launcher sets."""
    env = os.environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return []
    problems = _env_overrides(env, train)
    json_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if json_file != "none":
        fields = sorted(set(env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",")) & IGNORED_WITH_CONFIG_FILE)
        if fields:
            msg = (
                f"the accelerate YAML sets {fields} next to a DeepSpeed JSON (accelerate raises); delete them"
            )
            problems.append(_p("environment", "ACCELERATE_CONFIG_DS_FIELDS", msg))
        ds, load_problems = load_json_config(Path(json_file))
        problems += load_problems
        if ds is not None:
            problems += check_deepspeed_json(ds, json_file, train)
    return problems
