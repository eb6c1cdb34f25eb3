"""Whether a gRPC server answers at an address yet (tandem.ports.grpc_answers): `tandem generate
--wait` and the test bed's start wait on it."""

import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import tandem.ports as ports_module
from tandem.ports import free_port, grpc_answers


def test_a_grpc_server_answers_and_a_free_port_does_not_within_the_timeout():
    port = free_port()
    assert not grpc_answers(f"127.0.0.1:{port}", 0.5)
    server = grpc.server(ThreadPoolExecutor(1))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        assert grpc_answers(f"127.0.0.1:{port}", 10.0)
    finally:
        server.stop(None)


def test_a_free_port_lies_below_the_kernels_ephemeral_range_and_is_never_handed_out_twice():
    # The kernel picks every outgoing connection's port from its ephemeral range: a port from
    # there could be taken before a slow server (Serve's proxy) binds it.
    if ports_module._ephemeral_low() <= ports_module.SPAN[0] + 50:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(ports_module.SPAN[0] <= p < ports_module._ephemeral_low() for p in ports)


def test_a_free_port_skips_one_that_is_taken(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(ports_module, "SPAN", (port, port))  # the only candidate is taken
    monkeypatch.setattr(ports_module, "_ephemeral_low", lambda: port + 1)
    try:
        got = free_port()
        assert got != port and not ports_module.port_in_use("127.0.0.1", got)
    finally:
        taken.close()
