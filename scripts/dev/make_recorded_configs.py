"""Write tests/data/recorded_configs/: the shipped configs as an older framer_ds resolved and recorded them
(`dump_run_config`, what a checkpoint's and an export's config.yaml hold), so that tests check that runs
written before a config key was renamed still load (`validate_run_config(..., recorded=True)`).

How: `git archive COMMIT` of this repository into a temporary directory, and that version's own code
(the shared virtualenv's python, PYTHONPATH at the archive) loads each of its shipped configs below
and dumps it; each file also names, as `_shipped`, the config it came from, which the test loads today
to compare. The files were written with COMMIT e005c74 (the shapes before issue 32 §3):

    python scripts/dev/make_recorded_configs.py e005c74
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "recorded_configs"
# {file stem: shipped config under configs/}: every task, both video bases, a model path and a fresh config
CONFIGS = {
    "quickstart": "quickstart.yaml",
    "vit_large_imagenet": "tasks/vit_classification/vit_large_imagenet.yaml",
    "video_lora_tiny": "tasks/video_lora/tiny.yaml",
    "video_lora_framer_tiny": "tasks/video_lora/framer_tiny.yaml",
    "video_lora_framer_lora": "tasks/video_lora/framer_lora_576x576_10f.yaml",
    "tts_lm_tiny": "tasks/tts_lm/tiny.yaml",
    "tts_lm_lora_sft": "tasks/tts_lm/lora_sft.yaml",
    "drivable_vit_tiny": "tasks/drivable_vit/tiny.yaml",
}
DUMP = """
import sys, yaml
from framer_ds.config.loader import dump_run_config
from framer_ds.tasks.run_config import load_run_config
config = load_run_config(sys.argv[1], ["output_dir=/runs/recorded"])
print(yaml.safe_dump({"_shipped": sys.argv[2]}, sort_keys=False) + dump_run_config(config), end="")
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("commit", help="the framer_ds version whose configs to record")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.commit], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        for stem, shipped in CONFIGS.items():
            dumped = subprocess.run(
                [sys.executable, "-c", DUMP, str(Path(tmp) / "configs" / shipped), shipped],
                check=True,
                capture_output=True,
                text=True,
                cwd=tmp,
                env={**os.environ, "PYTHONPATH": tmp},
            ).stdout
            (OUT / f"{stem}.yaml").write_text(f"# framer_ds {args.commit}: configs/{shipped}\n{dumped}")
            print(f"wrote {OUT / stem}.yaml")


if __name__ == "__main__":
    main()
