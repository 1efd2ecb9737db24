"""Fault cases: storage going wrong under a run or an export (a kill mid-export, a full disk, an
output_dir that cannot be written), and unusable input files met at start."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.harness import case, cli, mlp, train_steps

from conftest import REPO, accelerate_launch_cmd, launch_env, strategy_launch_args
from framer_ds.engine.manifest import verify_checkpoint

# --- exports -----------------------------------------------------------------------------------------

# Runs `framer-ds export ... --format merged` and SIGKILLs itself once the pipeline is half written:
# a kill at exactly that phase (polling for the staging directory from outside races a tiny export).
_KILLED_EXPORT = """
import os, signal, sys
from diffusers import StableVideoDiffusionPipeline
def half_then_killed(self, directory, **kwargs):
    (directory / "unet").mkdir(parents=True)
    (directory / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)
StableVideoDiffusionPipeline.save_pretrained = half_then_killed
from framer_ds.cli.main import main
main(sys.argv[1:])
"""


@case(
    "`framer-ds export --format merged` killed (SIGKILL) while writing the pipeline, then run again",
    "the second export succeeds into the same --out and removes the staging directory the kill left",
)
def a_killed_merged_export_leaves_nothing_behind(tmp: Path) -> str:
    from video_adapters import make_adapter

    adapter, _ = make_adapter(tmp)
    out = tmp / "exports" / "merged"
    argv = ["export", str(adapter), "--format", "merged", "--out", str(out)]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT, *argv], cwd=REPO, env=launch_env(), capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = [p.name for p in out.parent.iterdir()]
    assert not out.exists() and len(left) == 1 and left[0].startswith(".tmp_merged."), left
    again = cli(*argv)
    assert again.rc == 0, again.err[-2000:]
    after = sorted(p.name for p in out.parent.iterdir())
    assert after == ["merged"] and (out / "model_index.json").is_file(), after
    return f"the kill left {left[0].rsplit('.', 2)[0]}.<host>.<pid>.<id>; the next export removed it: {after}"


@case(
    "`framer-ds export --format comfyui --out ComfyUI/models/loras`: the folder already holds another LoRA "
    "and a note, then a file of the export's name is exported again, without and with --overwrite",
    "the LoRA file is added beside the others and is 0644 under umask 022; the same name again is refused "
    "in one line naming --overwrite; --overwrite replaces that file only; the others are never touched (the "
    "Wan path deleted them, the SVD path refused the folder, and the file was 0600)",
)
def an_export_into_a_loras_folder_keeps_the_other_loras(tmp: Path) -> str:
    from conftest import umask, wrong_modes
    from framer_ds.tasks.video_lora.export_formats import COMFYUI_FILE
    from video_adapters import make_adapter

    adapter, _ = make_adapter(tmp)
    loras = tmp / "ComfyUI" / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "other_lora.safetensors").write_bytes(b"someone else's weights")
    (loras / "readme.txt").write_text("mine\n")
    others = {p.name: p.read_bytes() for p in loras.iterdir()}
    argv = ["export", str(adapter), "--format", "comfyui", "--out", str(loras)]
    with umask(0o022):
        first, again, overwritten = cli(*argv), cli(*argv), cli(*argv, "--overwrite")
    assert first.rc == 0 and overwritten.rc == 0, (first.err[-2000:], overwritten.err[-2000:])
    assert again.rc == 1 and "pass --overwrite" in again.err and "Traceback" not in again.err, again.err
    assert {name: (loras / name).read_bytes() for name in others} == others
    assert sorted(p.name for p in loras.iterdir()) == sorted([*others, COMFYUI_FILE])
    assert wrong_modes(loras / COMFYUI_FILE, 0o022) == []
    refusal = again.err[again.err.index("exists;") :].splitlines()[0]  # after the (temporary) path
    return (
        f"added {COMFYUI_FILE} (0644) beside {sorted(others)}; again: '... {refusal}'; --overwrite: "
        "replaced it, the others unchanged"
    )


# --- full disks and paths that cannot be written -----------------------------------------------------


@contextlib.contextmanager
def tmpfs(directory: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at `directory`: a real file system that really fills up (or is read-only), which a
    chmod cannot fake for root. Skips where mounting is not permitted (not root, no CAP_SYS_ADMIN)."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


@case(
    "the disk fills up while a checkpoint is written (a real ENOSPC: output_dir on a 4 MiB tmpfs, each "
    "checkpoint of the test MLP ~2.5 MB)",
    "one line 'no space left on <checkpoints>: <n> bytes needed, <f> free; step_1 is kept' and exit 1, no "
    "traceback; step_1 still verifies, the partial step_2 is gone, and after space is freed the run resumes",
)
def a_full_disk_keeps_the_previous_checkpoint(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"length.steps": 2, "checkpoint.every.steps": 1})
    with tmpfs(tmp / "disk", "size=4m") as disk:
        run = disk / "run"
        full = cli("train", str(config), f"output_dir={run}")
        assert full.rc == 1, full.err[-2000:]
        line = full.err.strip().splitlines()[-1]
        root = run / "checkpoints"
        assert line.startswith(f"error: no space left on {root}: ") and "bytes needed" in line, full.err
        assert "step_1 is kept" in line
        assert "unexpected pos" not in full.err and "RuntimeError" not in full.err
        assert sorted(p.name for p in root.iterdir()) == ["step_1"]
        assert verify_checkpoint(root / "step_1").ok
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        resumed = cli("train", str(config), f"output_dir={run}", "train.resume=latest")
        assert resumed.rc == 0, resumed.err[-2000:]
        assert train_steps(run) == [1, 2] and (run / "final").is_dir()
    return f"exit 1: {line.removeprefix('error: ').split(';')[0]}; step_1 kept; resumed after remount"


@case(
    "output_dir is a dangling symlink, or lies on a read-only file system (a tmpfs mounted ro)",
    "one line naming output_dir and the reason, exit 1, no traceback (was FileExistsError / OSError)",
)
def an_unwritable_output_dir_is_one_line(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"length.steps": 1})
    (tmp / "dangling").symlink_to(tmp / "unmounted")
    dangling = cli("train", str(config), f"output_dir={tmp / 'dangling'}")
    with tmpfs(tmp / "ro", "ro,size=1m") as read_only:
        ro = cli("train", str(config), f"output_dir={read_only / 'run'}")
    seen = []
    for result, needle in ((dangling, "which does not exist"), (ro, "Read-only file system")):
        lines = result.err.strip().splitlines()
        assert result.rc == 1 and len(lines) == 1 and needle in lines[0], result.err
        assert lines[0].startswith("error: output_dir "), lines
        seen.append(needle)
    assert not (tmp / "unmounted").exists()
    return f"exit 1, one line each: {', '.join(repr(s) for s in seen)}"


# --- unusable input files ----------------------------------------------------------------------------


@case(
    "data.source.path holds a zero-byte .mp4 and a text file named .mp4 beside 4 good clips (video_lora)",
    "training refuses to start: '2 of 6 video files (33%) are unusable, more than "
    "data.max_rejected_fraction (0.1)', each file named; allowed with data.max_rejected_fraction=0.5, the "
    "run summary says 'usable: 4, rejected: 2' and names both (as `data check` does)",
)
def broken_videos_are_named_at_start(tmp: Path) -> str:
    from framer_ds.tasks.video_lora.data.synthetic_video import ensure_synthetic_clips

    root = tmp / "videos"
    shutil.copytree(ensure_synthetic_clips(tmp / "clips", count=4), root)
    (root / "empty.mp4").write_bytes(b"")
    (root / "notes.mp4").write_text("this is a text file, not a video\n")
    tiny = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
    argv = [
        "train",
        str(tiny),
        f"output_dir={tmp / 'run'}",
        "data.source.builtin=null",
        f"data.source.path={root}",
    ]
    argv += ["train.length.steps=1", "train.eval.every=null", "train.checkpoint.every=null"]
    argv += ["model.samples.every=0", "data.val_fraction=0"]
    refused = cli(*argv)
    assert refused.rc == 1 and "2 of 6 video files (33%) are unusable" in refused.err, refused.err[-3000:]
    assert "data.max_rejected_fraction (0.1)" in refused.err and "Traceback" not in refused.err
    for name in ("empty.mp4", "notes.mp4"):
        assert f"rejected {root / name}: " in refused.err, refused.err
    assert not (tmp / "run" / "metrics.jsonl").exists()
    allowed = cli(*argv, f"output_dir={tmp / 'allowed'}", "data.max_rejected_fraction=0.5")
    assert allowed.rc == 0, allowed.err[-3000:]
    assert "usable: 4, rejected: 2" in allowed.out, allowed.out
    for name in ("empty.mp4", "notes.mp4"):
        assert f"rejected {root / name}: PyAV cannot read it" in allowed.out, allowed.out
    return "refused at 33% > 0.1 naming both files; at 0.5 trains and its summary names both"


# --- a checkpoint resumed under another strategy -----------------------------------------------------


@case(
    "a 2-process ZeRO-2 checkpoint resumed under ZeRO-3 (the launch's --deepspeed_config_file swapped)",
    "every rank stops before loading with one line: written under ZeRO-2, this run uses ZeRO-3, resume "
    "with configs/deepspeed/zero2.json (`framer-ds checkpoint universal` named: it changes the world size, "
    "not the stage); was a bare AssertionError from DeepSpeed's load_checkpoint",
    multi_process=True,
)
def a_zero2_checkpoint_resumed_under_zero3(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 2, "checkpoint.every.steps": 2})
    zero2 = launch(strategy_launch_args("zero2", tmp), config)
    assert zero2.returncode == 0, zero2.stderr[-3000:]
    resumed = launch(
        strategy_launch_args("zero3", tmp), config, "train.resume=latest", "train.length.steps=4"
    )
    assert resumed.returncode != 0, resumed.stdout[-2000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 2 and lines[0] == lines[1], resumed.stderr[-4000:]  # one line per rank
    assert "written under ZeRO-2 but this run uses ZeRO-3" in lines[0] and "zero2.json" in lines[0]
    assert "AssertionError" not in resumed.stderr and "[rank0]: Traceback" not in resumed.stderr
    assert train_steps(run) == [1, 2] and not (run / "checkpoints" / "step_2" / "universal").exists()
    return (
        "exit non-zero; each rank: 'error: ... written under ZeRO-2 but this run uses ZeRO-3 ... zero2.json'"
    )


def launch(launch_args: list[str], config: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = accelerate_launch_cmd(*launch_args, "-m", "framer_ds", "train", str(config), *overrides)
    return subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
