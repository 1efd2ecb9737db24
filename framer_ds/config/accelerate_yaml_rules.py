"""The accelerate YAML rules of the launch pre-flight (facts in docs/architecture.md, "Accelerate +
DeepSpeed", read from the accelerate 1.15 / deepspeed 0.19.8 sources).

Why its own module: an accelerate YAML fails in its own ways (keys accelerate launch rejects, process
counts it misreads, a rendezvous with no head node, DeepSpeed keys that clash with a JSON) and is also
read by `launch.environment` to pick the launcher; the DeepSpeed JSON rules live in
deepspeed_json_rules.py. Each rule returns every problem it finds, so a user fixes all of them in one
edit.
"""

from __future__ import annotations

from typing import Any

from framer_ds.config.errors import did_you_mean
from framer_ds.config.launch_files import Cfg, Problems, mapping_section
from framer_ds.config.launch_files import problem_at as _p
from framer_ds.config.schema import TrainConfig

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


def is_deepspeed(acc: Cfg) -> bool:
    """The YAML launches DeepSpeed: the rules about its JSON and plugin keys apply."""
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
    launcher = mapping_section(acc, "deepspeed_config").get("deepspeed_multinode_launcher", "pdsh")
    machines = acc.get("num_machines", 1)
    return is_deepspeed(acc) and _positive_int(machines) and machines > 1 and launcher != "standard"


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
    if not json_in_use or not is_deepspeed(acc):
        return []
    why = "is not allowed next to a DeepSpeed JSON (accelerate raises 'will be ignored')"
    out = [
        _p(src, f"deepspeed_config.{key}", f"{why}; move it into the JSON / training YAML, delete it here")
        for key in mapping_section(acc, "deepspeed_config")
        if key.lower() in IGNORED_WITH_CONFIG_FILE
    ]
    if "mixed_precision" in acc:
        msg = f"{why}, even as 'no'; delete it: train.mixed_precision fills the JSON's \"auto\" precision"
        out.append(_p(src, "mixed_precision", msg))
    return out


def check_plugin_values_match_train(acc: Cfg, src: str, train: TrainConfig | None) -> Problems:
    """Without a JSON, deepspeed_config.gradient_* become env vars that silently beat the training YAML."""
    section = mapping_section(acc, "deepspeed_config")
    if train is None or not is_deepspeed(acc) or "deepspeed_config_file" in section:
        return []
    wanted = {
        "gradient_accumulation_steps": ("gradient_accumulation_steps", train.gradient_accumulation_steps)
    }
    wanted["gradient_clipping"] = ("optimizer.max_grad_norm", train.optimizer.max_grad_norm)
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
    section = mapping_section(acc, "deepspeed_config")
    if not is_deepspeed(acc):
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
