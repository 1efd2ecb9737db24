"""gloo's interface on a node whose hostname resolves to loopback (framer_ds/launch/network.py). The
failure itself, and the fix working across two nodes, are shown on the real cluster
(tests/launch/test_cluster.py, where each node's name resolves to 127.0.1.1); these check the decisions."""

from __future__ import annotations

import socket

import pytest

from framer_ds.launch import network
from framer_ds.launch.smoke import hint_for

MULTI_NODE = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}


@pytest.fixture
def loopback_hostname(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")  # resolves to 127.0.0.1 everywhere


def outside_address() -> tuple[str, str]:
    found = [(name, a) for name, a in network.interface_addresses().items() if not a.startswith("127.")]
    if not found:
        pytest.skip("this machine has no non-loopback IPv4 interface")
    return found[0]


def test_the_interface_that_routes_to_the_head_is_set(loopback_hostname):
    interface, address = outside_address()
    environ = {**MULTI_NODE, "MASTER_ADDR": address}
    note = network.pin_gloo_interface(environ)
    assert environ["GLOO_SOCKET_IFNAME"] == interface
    assert note is not None and "localhost resolves to 127.0.0.1 (loopback" in note
    assert f"using GLOO_SOCKET_IFNAME={interface}" in note
    assert "NCCL_SOCKET_IFNAME" not in environ  # NCCL picks its own interfaces


@pytest.mark.parametrize(
    "environ",
    [
        {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},  # one machine
        {"WORLD_SIZE": "1"},  # not launched
        {**MULTI_NODE, "MASTER_ADDR": "10.1.2.3", "GLOO_SOCKET_IFNAME": "ib0"},  # the user chose
    ],
    ids=["one_machine", "not_launched", "user_set"],
)
def test_nothing_changes_where_gloo_finds_its_peers(loopback_hostname, environ):
    before = dict(environ)
    assert network.pin_gloo_interface(environ) is None
    assert environ == before


def test_a_hostname_that_resolves_outside_loopback_is_left_alone(monkeypatch):
    _, address = outside_address()
    monkeypatch.setattr(socket, "gethostname", lambda: address)
    environ = {**MULTI_NODE, "MASTER_ADDR": address}
    assert network.pin_gloo_interface(environ) is None and "GLOO_SOCKET_IFNAME" not in environ


def test_the_rendezvous_hint_names_a_peer_advertising_loopback():
    error = "Gloo connectFullMesh failed: SO_ERROR: Connection refused, remote=[127.0.1.1]:3982"
    hint = hint_for(error)
    assert "loopback" in hint and "GLOO_SOCKET_IFNAME" in hint and "nothing listens" not in hint
