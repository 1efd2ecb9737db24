"""`scripts/dev/cluster.sh check` decides whether the real-cluster tests run (tests/real_cluster.py): where
this machine cannot build the cluster, they skip with its one line, and never fail half-way through
`up`. A container run as root may lack a capability `up` needs (CAP_NET_ADMIN for the bridge,
CAP_SYS_ADMIN for the namespaces); `check` tries each in a throw-away namespace and names the one that
is missing. Here that is shown by dropping one capability from a root shell (util-linux's `setpriv`).

Its own file, not tests/launch/test_cluster.py: that one's tests build the cluster first. The probe's
namespace has a name of its own, so it may run while a cluster is up."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from real_cluster import SCRIPT


def check(*prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, "bash", str(SCRIPT), "check"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("capability", "reason"),
    [
        ("net_admin", "cannot create a bridge (ip link add type bridge: "),
        ("sys_admin", "cannot create network namespaces here (ip netns add: "),
    ],
)
def test_a_missing_capability_is_named_in_one_line(capability, reason):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to drop a capability")
    plain = check()
    if plain.returncode != 0:
        pytest.skip(f"this machine cannot build the cluster anyway: {plain.stdout.strip()}")
    drop = ("setpriv", f"--inh-caps=-{capability}", f"--bounding-set=-{capability}")
    proc = check(*drop)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(reason), proc.stdout
    assert not [name for name in os.listdir("/run/netns") if name.startswith("fds-probe")]


def test_where_the_cluster_is_required_a_missing_one_fails_instead_of_skipping(monkeypatch):
    """`.ci/run` sets FRAMER_DS_REQUIRE_CLUSTER=1: a CI machine that cannot build the cluster then fails
    the cluster tests, naming why, so a green CI run means they ran; elsewhere they skip."""
    from real_cluster import REQUIRED_ENV, _skip

    monkeypatch.delenv(REQUIRED_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no bridge"):
        _skip("no bridge")
    monkeypatch.setenv(REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"no bridge .{REQUIRED_ENV}=1"):
        _skip("no bridge")
    ci_run = (SCRIPT.parents[2] / ".ci" / "run").read_text()
    assert f'export {REQUIRED_ENV}="${{{REQUIRED_ENV}:-1}}"' in ci_run
