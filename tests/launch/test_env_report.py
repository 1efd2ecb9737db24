"""`framer-ds env` names a second ninja: DeepSpeed's JIT ops are rebuilt whenever launches alternate
between two ninja versions (the test suite itself rebuilt them 3-4 times per run that way)."""

from __future__ import annotations

from pathlib import Path

from framer_ds.launch.env_report import format_machine_report, machine_report, ninja_report


def fake_ninja(directory: Path, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "ninja"
    binary.write_text(f"#!/bin/sh\necho {version}\n")
    binary.chmod(0o755)
    return binary


def test_a_different_ninja_first_on_path_is_named_with_the_fix(tmp_path):
    system = fake_ninja(tmp_path / "usr_bin", "1.11.1")
    venv = fake_ninja(tmp_path / "venv" / "bin", "1.13.2")
    python = str(venv.parent / "python")

    report = ninja_report(path=str(system.parent), python=python)
    assert report["on_path"] == str(system) and report["version"] == "1.11.1"
    assert f"{venv} (1.13.2) is not the ninja on PATH ({system}, 1.11.1)" in report["warning"]
    assert f"put {venv.parent} first on PATH" in report["warning"]

    assert ninja_report(path=f"{venv.parent}:{system.parent}", python=python)["warning"] is None
    same = fake_ninja(tmp_path / "other_bin", "1.13.2")
    assert ninja_report(path=str(same.parent), python=python)["warning"] is None
    assert "is not the ninja" in ninja_report(path=str(tmp_path / "empty"), python=python)["warning"]


def test_the_machine_report_prints_the_ninja_line():
    text = format_machine_report(machine_report(None))
    assert "ninja (builds DeepSpeed's ops):" in text
