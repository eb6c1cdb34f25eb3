"""TCP ports: one that is free now, for a server the caller starts next (a local cluster's, a
test's), whether a given port is free to listen on, asked before a server binds it: a taken
port then gives one line that names it, instead of a library's traceback (gRPC's, http.server's),
and whether a gRPC server answers at an address yet."""

import errno
import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at host now (the system's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on port at an address host resolves to (port 0,
    "any free port", is never in use; a host that does not resolve is left to the server's
    own bind to report)."""
    if not port:
        return False
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            # As gRPC and http.server bind: a port whose old connections linger in TIME_WAIT is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def port_in_use_line(program: str, port: int, what: str, host: str) -> str:
    """The one line a program exits with when port (for `what`: gRPC, metrics) is taken."""
    return f"{program}: port {port} ({what}) on {host} is in use"


def grpc_answers(address: str, timeout_s: float) -> bool:
    """Whether a gRPC server at address ("host:port") accepts a connection within timeout_s: a
    fresh channel every 2 s at most, so that a refused one's backoff does not hold the wait."""
    import grpc  # the package's light modules do not need it

    deadline = time.monotonic() + timeout_s
    while True:
        channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            return True
        except grpc.FutureTimeoutError:
            if time.monotonic() >= deadline:
                return False
        finally:
            channel.close()
