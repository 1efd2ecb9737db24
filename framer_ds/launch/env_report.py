"""What `framer-ds env` reports about this machine: versions, devices, limits, disk, accelerate's default
config. Everything a cluster support ticket asks for first, in one command."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "accelerate", "deepspeed", "transformers", "peft", "diffusers", "safetensors", "wandb")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _locked_memory_limit() -> str:
    """`ulimit -l`: pinned memory for offload buffers (DeepSpeed pins by default since 0.19.5)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"


def _deepspeed_ops() -> dict[str, bool] | str:
    """Whether DeepSpeed's JIT ops (built at first use with g++/ninja) can build here."""
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        builders = {"cpu_adam": CPUAdamBuilder()}
        try:
            from deepspeed.ops.op_builder import FusedAdamBuilder

            builders["fused_adam"] = FusedAdamBuilder()
        except ImportError:
            pass
        return {name: bool(builder.is_compatible(verbose=False)) for name, builder in builders.items()}
    except Exception as exc:  # a report: any failure is information, not a crash
        return f"unknown ({type(exc).__name__}: {exc})"


def _ninja_version(binary: Path | str | None) -> str | None:
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def ninja_report(path: str | None = None, python: str = sys.executable) -> dict[str, Any]:
    """The ninja DeepSpeed's JIT op builds run (the first on PATH) and the one installed beside this
    Python. Why: when some launches find one and others the other (a launcher that puts its own bin
    directory first, an unactivated venv), each version discards the other's build log in the shared
    torch_extensions cache and every op is rebuilt, ~1 minute each, job after job."""
    first = shutil.which("ninja", path=path)
    beside = Path(python).parent / "ninja"
    report: dict[str, Any] = {"on_path": first, "version": _ninja_version(first), "warning": None}
    if beside.is_file() and (first is None or Path(first).resolve() != beside.resolve()):
        own = _ninja_version(beside)
        if own != report["version"]:
            report["warning"] = (
                f"{beside} ({own}) is not the ninja on PATH ({first or 'none'}, {report['version'] or '-'}): "
                f"DeepSpeed rebuilds its ops whenever launches alternate between them; put {beside.parent} "
                "first on PATH (activate the venv) in the job script"
            )
    return report


def _devices() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(torch.cuda.device_count())
    ]


def _accelerate_default_config() -> dict[str, Any]:
    try:
        from accelerate.commands.config.config_args import default_config_file
    except ImportError:
        return {"path": None}
    path = Path(default_config_file)
    if not path.is_file():
        return {"path": str(path), "exists": False}
    import yaml

    try:
        content = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        return {"path": str(path), "exists": True, "error": str(exc)}
    keys = ("distributed_type", "num_processes", "num_machines", "mixed_precision", "use_cpu")
    return {"path": str(path), "exists": True, **{k: content.get(k) for k in keys if k in content}}


def machine_report(output_dir: Path | None) -> dict[str, Any]:
    import torch

    disk_root = Path(output_dir or ".").resolve()
    while not disk_root.exists():
        disk_root = disk_root.parent
    cuda = torch.version.cuda
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda and torch.cuda.is_available() else None,
        "gpus": _devices(),
        "deepspeed_ops": _deepspeed_ops() if _version("deepspeed") else "deepspeed not installed",
        "ninja": ninja_report(),
        "locked_memory_limit": _locked_memory_limit(),
        "free_disk_gib": {str(disk_root): round(shutil.disk_usage(disk_root).free / 2**30, 1)},
        "cpu_count": os.cpu_count(),
        "accelerate_default_config": _accelerate_default_config(),
    }


def format_machine_report(report: dict[str, Any]) -> str:
    packages = ", ".join(f"{k} {v or 'missing'}" for k, v in report["packages"].items())
    gpus = "; ".join(f"{g['index']}: {g['name']} ({g['memory_gib']} GiB)" for g in report["gpus"]) or "none"
    lines = [
        f"host: {report['host']} ({report['cpu_count']} CPUs), Python {report['python']}, "
        f"{report['platform']}",
        f"packages: {packages}",
        f"CUDA {report['cuda'] or '-'}, cuDNN {report['cudnn'] or '-'}, NCCL {report['nccl'] or '-'}",
        f"GPUs: {gpus}",
        f"DeepSpeed ops buildable: {report['deepspeed_ops']}",
        f"ninja (builds DeepSpeed's ops): {report['ninja']['on_path'] or 'none'} "
        f"{report['ninja']['version'] or ''}".rstrip(),
        f"locked-memory limit (ulimit -l): {report['locked_memory_limit']}",
        "free disk: " + ", ".join(f"{k} {v} GiB" for k, v in report["free_disk_gib"].items()),
        f"accelerate default config: {report['accelerate_default_config']}",
    ]
    if report["ninja"]["warning"]:
        lines.append(f"warning: {report['ninja']['warning']}")
    return "\n".join(lines)
