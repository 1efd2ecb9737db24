"""Fault cases: storage going wrong under a run or an export (a kill mid-export, a full disk, an
output_dir that cannot be written), and unusable input files met at start."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from faults.harness import case, cli

from conftest import REPO, launch_env

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
    from test_export_formats import make_adapter

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
