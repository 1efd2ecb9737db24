"""The fake cluster tools report a failed node as a failure, as the real ones do: a stub that exits 0
for a crashed rank lets a launch test pass its first assertion and fail later with no output."""

from __future__ import annotations

import os
import subprocess

from cluster_stubs import install_cluster_stubs


def test_pdsh_exits_with_the_worst_host_status(tmp_path):
    bin_dir = install_cluster_stubs(tmp_path, ("pdsh",))
    env = {**os.environ, "STUB_LOG": str(tmp_path)}
    run = [str(bin_dir / "pdsh"), "-S", "-w", "a,b"]
    failed = subprocess.run(
        [*run, "echo host %n; [ %n = 1 ] && exit 3; exit 0"], env=env, capture_output=True, text=True
    )
    assert failed.returncode == 3 and "a: host 0" in failed.stdout and "b: host 1" in failed.stdout
    assert subprocess.run([*run, "true"], env=env).returncode == 0
