"""TCP ports: one that is free now, for a server the caller starts next (a local cluster's, a
test's), whether a given port is free to listen on, asked before a server binds it: a taken
port then gives one line that names it, instead of a library's traceback (gRPC's, http.server's),
and whether a gRPC server answers at an address yet."""

import errno
import random
import socket
import time

# Where free_port looks: above the ports Ray's workers listen on (10000–19999 by default), below
# the kernel's ephemeral range, from which it picks every port(0) bind and every outgoing
# connection's local port. A port handed out there stayed free until its server bound it,
# however long that took; the kernel's own pick did not: Serve's proxy, bound ~20 s after, once
# found one taken by a connection of Ray's starting up (CI, 2026-11-27).
SPAN = (20000, 32767)
_handed_out: set[int] = set()  # this process's picks: two servers started next never share one


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at host now, for a server started next: one in SPAN below the
    kernel's ephemeral range (the kernel's own pick where that range leaves none)."""
    low, high = SPAN[0], min(SPAN[1], _ephemeral_low() - 1)
    for port in random.sample(range(low, high + 1), min(200, max(0, high + 1 - low))):
        if port not in _handed_out and not port_in_use(host, port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
