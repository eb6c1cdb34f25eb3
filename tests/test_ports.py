"""Whether a gRPC server answers at an address yet (tandem.ports.grpc_answers): `tandem generate
--wait` and the test bed's start wait on it."""

from concurrent.futures import ThreadPoolExecutor

import grpc

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
