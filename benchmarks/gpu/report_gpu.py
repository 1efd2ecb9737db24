"""The GPU suite's header (device, driver, versions, date) and its markdown table."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import subprocess
from typing import Any

TARGET = 0.15  # the planner's accuracy target (issue 16)
PACKAGES = ("torch", "accelerate", "deepspeed", "transformers", "diffusers", "peft")


def environment() -> dict[str, Any]:
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if gpu else f"CPU ({platform.machine()})",
        "driver": _driver() if gpu else "-",
        "cuda": torch.version.cuda or "-",
        "python": platform.python_version(),
        "versions": versions,
        "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
    }


def _driver() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"


def _number(record: dict[str, Any], key: str, spec: str) -> str:
    value = record.get(key)
    return "-" if value is None else format(value, spec)


def _note(record: dict[str, Any]) -> str:
    if not record.get("ok", True):
        return f"FAILED: {record.get('error', '')}"
    parts = [record[k] for k in ("summary", "note", "plan_error_text") if record.get(k)]
    if "overhead_ratio" in record:
        parts.append(
            f"hand-written loop {record['hand_loop_samples_per_s']:.4g} samples/s: framer_ds takes "
            f"{record['overhead_ratio']:.3f}x its time"
        )
    return "; ".join(parts).replace("|", "/")


def markdown(
    records: list[dict[str, Any]], header: dict[str, Any], titles: list[str], steps: list[str]
) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
    lines = [
        "## GPU suite",
        "",
        f"Command: `{header['command']}`",
        "",
        f"Machine: {header['device']}, driver {header['driver']}, CUDA {header['cuda']}; {versions}; "
        f"Python {header['python']}; {header['date']}. Raw lines: `RAW_RESULTS`.",
        "",
    ]
    if header.get("smoke"):
        lines += [
            "Smoke run at tiny sizes (on a CPU in CI): it proves the suite runs; no figure here is a "
            "GPU figure.",
            "",
        ]
    lines += [
        "Steps: "
        + "; ".join(f"{i}. {s} ({t})" for i, (s, t) in enumerate(zip(steps, titles, strict=True), 1)),
        "",
        "| step | measurement | strategy | peak GiB | s/step | samples/s | tokens/s | plan GiB | plan error "
        "| beside it | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: steps.index(r["step"]) if r["step"] in steps else len(steps)):
        error = r.get("plan_error")
        cells = [
            r["step"],
            r.get("name", "-"),
            r.get("strategy", "-"),
            _number(r, "peak_gib", ".2f"),
            _number(r, "s_per_step", ".3f"),
            _number(r, "samples_per_s", ".3g"),
            _number(r, "tokens_per_s", ".4g"),
            _number(r, "predicted_gib", ".2f"),
            "-" if error is None else f"{error:+.1%}",
            r.get("reference", ""),
            _note(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [abs(r["plan_error"]) for r in records if r.get("plan_error") is not None]
    if errors:
        within = sum(e <= TARGET for e in errors)
        lines += [
            "",
            f"Plan vs measured: {within} of {len(errors)} cells within {TARGET:.0%}; "
            f"largest error {max(errors):.1%}.",
        ]
    failed = [r for r in records if not r.get("ok", True)]
    lines += ["", f"{len(records) - len(failed)} measurements, {len(failed)} failed."]
    return "\n".join(lines) + "\n"
