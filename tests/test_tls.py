"""Mutual TLS between the orchestrator and the workers, and TLS to Redis, on real processes.

A local CA and certificates from tandem.certs (and `tandem certs`); a draft worker and a
target verifier started as `tandem worker --tls-cert --tls-key --tls-ca` on 127.0.0.1, with
tiny random models; the orchestrator's own clients and pool calling them. The embedded
redis-server is built without TLS, so Redis over TLS goes through a TLS-terminating proxy in
front of it: a real handshake, a real Redis behind it. No Ray here.
"""

import asyncio
import contextlib
import os
import ssl
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem import certs, cli
from tandem.local import spawn_worker, stop_processes
from tandem.math.params import SamplingParams
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.config import OrchestratorConfig
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.pool import WorkerPool
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.orchestrator.session import Request, Session
from tandem.orchestrator.store import SessionStore, StoreUnavailable, check_redis_url
from tandem.ports import free_port
from tandem.services.server import _check_ports
from tandem.tls import TLSFiles
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire

from support.models import llama_config, save_random_model

GREEDY = SamplingParams(temperature=0.0, seed=0)
REFUSED_WITHIN_S = 5.0  # a refused handshake answers at once; this only bounds the wait
PROMPT = [5, 9, 13, 17, 21]


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tls") / "certs"
    certs.make_certs(out)
    return out


@pytest.fixture(scope="module")
def other_ca_dir(tmp_path_factory) -> Path:
    """Certificates of the same shape from another CA: an impostor's."""
    out = tmp_path_factory.mktemp("tls") / "other"
    certs.make_certs(out)
    return out


@pytest.fixture(scope="module")
def workers(tmp_path_factory, ca_dir):
    """A draft worker and a target verifier, real `tandem worker` processes serving mutual TLS,
    each with a plain-text health port (under "health", by kind)."""
    root = tmp_path_factory.mktemp("tls-models")
    config = llama_config(vocab_size=64, layers=1, hidden=32, eos_token_id=2, max_context=64)
    models = {kind: save_random_model(config, str(root / kind), seed=seed) for kind, seed in (("draft", 1),
                                                                                              ("target", 0))}
    health = {"draft": free_port(), "target": free_port()}

    def spawn(kind: str):
        return spawn_worker(kind, models[kind], "127.0.0.1", 1, "cpu", "float32", echo=False,
                            tls=certs.worker_files(ca_dir), args=["--health-port", str(health[kind])])

    # Both at once: each start is mostly imports.
    with ThreadPoolExecutor(2) as pool:
        futures = {kind: pool.submit(spawn, kind) for kind in ("draft", "target")}
    started = {kind: f.result() for kind, f in futures.items() if f.exception() is None}
    try:
        for f in futures.values():
            f.result()  # raises a failed start's error, after the started one is in `started`
        yield {kind: address for kind, (_, address) in started.items()} | {"health": health}
    finally:
        stop_processes([proc for proc, _ in started.values()])


def _unavailable(call) -> grpc.StatusCode:
    """The status code a call that must fail fails with."""
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


async def _aio_code(coro) -> grpc.StatusCode:
    try:
        await coro
    except grpc.aio.AioRpcError as e:
        return e.code()
    raise AssertionError("the call went through")


# --- certificates ---------------------------------------------------------------------------


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_are_a_ca_a_server_and_a_client_certificate_with_private_keys(ca_dir):
    ca, worker, orchestrator = (_load(ca_dir / name) for name in ("ca.pem", "worker.pem", "orchestrator.pem"))
    for leaf in (worker, orchestrator):
        leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = worker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    usage = {leaf: list(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
             for leaf, c in (("worker", worker), ("orchestrator", orchestrator))}
    assert usage == {"worker": [ExtendedKeyUsageOID.SERVER_AUTH], "orchestrator": [ExtendedKeyUsageOID.CLIENT_AUTH]}
    for key in ("ca-key.pem", "worker-key.pem", "orchestrator-key.pem"):
        assert stat.S_IMODE(os.stat(ca_dir / key).st_mode) == 0o600
    certs.worker_files(ca_dir).check()
    certs.orchestrator_files(ca_dir).check()


def test_tandem_certs_keeps_the_ca_it_finds_and_reissues_for_new_hosts(tmp_path, capsys):
    out = tmp_path / "certs"
    cli.main(["certs", "--out", str(out), "--hosts", "tandem-draft.ns.svc,10.0.0.7", "--days", "30"])
    first = capsys.readouterr().out
    assert f"wrote {out / 'ca.pem'}" in first and f"wrote {out / 'worker-key.pem'} (0600)" in first
    ca = (out / "ca.pem").read_bytes()
    worker = _load(out / "worker.pem")
    names = worker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["tandem-draft.ns.svc"]
    assert 29 <= (worker.not_valid_after_utc - worker.not_valid_before_utc).days <= 30
    assert not certs.ensure_certs(out, ["tandem-draft.ns.svc"])  # all there, names covered: nothing issued
    assert certs.ensure_certs(out, ["tandem-target.ns.svc"])
    assert (out / "ca.pem").read_bytes() == ca  # the CA stays: certificates issued before stay valid
    _load(out / "worker.pem").verify_directly_issued_by(_load(out / "ca.pem"))


def test_tls_files_are_all_three_or_none_and_a_bad_one_is_named(ca_dir, tmp_path):
    assert TLSFiles.from_flags(None, None, None) is None
    with pytest.raises(ValueError, match="--tls-key, --tls-ca missing"):
        TLSFiles.from_flags(str(ca_dir / "worker.pem"), None, "")
    missing = TLSFiles(ca_dir / "worker.pem", tmp_path / "nope.pem", ca_dir / "ca.pem")
    with pytest.raises(ValueError, match=r"private key \(--tls-key\) .*nope\.pem: No such file"):
        missing.check()
    swapped = TLSFiles(ca_dir / "worker-key.pem", ca_dir / "worker-key.pem", ca_dir / "ca.pem")
    with pytest.raises(ValueError, match=r"certificate \(--tls-cert\) .*worker-key\.pem: not a PEM file with a CERT"):
        swapped.check()
    assert os.path.isabs(TLSFiles("a", "b", "c").ca)  # a Ray replica's working directory is not ours
    with pytest.raises(SystemExit, match="tandem worker: --tls-cert, --tls-key and --tls-ca go together"):
        cli.main(["worker", "draft", "--model", str(tmp_path), "--tls-cert", str(ca_dir / "worker.pem")])
    with pytest.raises(ValueError, match="nope.pem"):
        OrchestratorConfig(("127.0.0.1:1",), ("127.0.0.1:2",), "redis://127.0.0.1:6379/0", tls=missing)


# --- the workers ----------------------------------------------------------------------------


def test_a_tls_worker_refuses_a_plain_text_client(workers):
    for address in (workers["draft"], workers["target"]):
        with grpc.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.DraftWorkerStub(channel)
            assert _unavailable(lambda: stub.Load(wire.load_request(), timeout=REFUSED_WITHIN_S)) == (
                grpc.StatusCode.UNAVAILABLE)


def test_the_health_port_answers_grpc_health_in_plain_text_and_nothing_else(workers):
    """For Kubernetes' gRPC probe, which cannot present a client certificate: the worker's own
    status over grpc.health.v1, and no worker RPC in plain text."""
    for port in workers["health"].values():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = worker_pb2_grpc.DraftWorkerStub(channel)
            assert _unavailable(lambda: stub.Load(wire.load_request(), timeout=10)) == grpc.StatusCode.UNIMPLEMENTED


def test_a_health_port_that_is_another_port_of_the_worker_is_refused():
    with pytest.raises(SystemExit, match="gRPC and health cannot share port 5000"):
        _check_ports("127.0.0.1", 5000, 0, 5000)


def test_a_tls_worker_refuses_clients_the_ca_did_not_sign_and_the_client_refuses_impostors(
        workers, ca_dir, other_ca_dir, tmp_path):
    ours, theirs = certs.orchestrator_files(ca_dir), certs.orchestrator_files(other_ca_dir)
    no_client_cert = grpc.ssl_channel_credentials(root_certificates=(ca_dir / "ca.pem").read_bytes())
    cases = {
        "a client certificate from another CA": TLSFiles(theirs.cert, theirs.key, ours.ca),
        "a worker certificate the client's CA did not sign": TLSFiles(ours.cert, ours.key, theirs.ca),
    }

    async def main():
        codes = {}
        for case, files in cases.items():
            client = DraftClient(workers["draft"], timeout_s=REFUSED_WITHIN_S, tls=files)
            try:
                codes[case] = await _aio_code(client.load())
            finally:
                await client.close()
        # The certificate is for localhost and 127.0.0.1, not for another name at this address.
        client = DraftClient(workers["draft"], timeout_s=REFUSED_WITHIN_S, tls=ours, server_name="elsewhere.example")
        try:
            codes["a worker certificate for another name"] = await _aio_code(client.load())
        finally:
            await client.close()
        async with grpc.aio.secure_channel(workers["draft"], no_client_cert) as channel:
            stub = worker_pb2_grpc.DraftWorkerStub(channel)
            codes["no client certificate"] = await _aio_code(stub.Load(wire.load_request(), timeout=REFUSED_WITHIN_S))
        return codes

    codes = asyncio.run(asyncio.wait_for(main(), 60))
    assert codes == dict.fromkeys(codes, grpc.StatusCode.UNAVAILABLE) and len(codes) == 4


def test_the_orchestrators_clients_describe_propose_and_verify_over_mutual_tls(workers, ca_dir):
    tls = certs.orchestrator_files(ca_dir)

    async def main():
        draft = DraftClient(workers["draft"], timeout_s=30, tls=tls)
        target = VerifierClient(workers["target"], timeout_s=30, tls=tls)
        try:
            infos = await draft.describe(), await target.describe()
            proposal = (await draft.propose("tls", 0, PROMPT, 3, GREEDY)).answer
            verification = (await target.verify("tls", 0, PROMPT, proposal, GREEDY)).answer
            await draft.release("tls")
            await target.release("tls")
            return infos, proposal, verification
        finally:
            await draft.close()
            await target.close()

    (draft_info, target_info), proposal, verification = asyncio.run(asyncio.wait_for(main(), 120))
    assert draft_info.vocab_size == target_info.vocab_size == 64
    assert len(proposal.draft_tokens) == 3 and all(0 <= t < 64 for t in proposal.draft_tokens)
    assert len(verification.target_token_probs) == 3 and 0 <= verification.bonus_token < 64


def test_a_pool_dials_the_ip_a_name_resolves_to_and_checks_the_certificate_for_the_name(workers, ca_dir):
    port = workers["draft"].rsplit(":", 1)[1]

    async def main():
        tls = certs.orchestrator_files(ca_dir)
        pool = WorkerPool("draft", [f"localhost:{port}"], DraftClient, timeout_s=30, tls=tls)
        try:
            await pool.start()
            assert await pool.wait_available(60), "no worker of the pool came up over TLS"
            worker = pool.route()
            reply = await worker.client.propose("pool-tls", 0, PROMPT, 2, GREEDY)
            return worker.address, pool.info, reply.answer
        finally:
            await pool.close()

    address, info, proposal = asyncio.run(asyncio.wait_for(main(), 90))
    assert address == f"127.0.0.1:{port}"  # the IP, dialled with the name "localhost" checked
    assert info.vocab_size == 64 and len(proposal.draft_tokens) == 2


# --- Redis over TLS ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _tls_proxy(context: ssl.SSLContext, upstream_port: int):
    """A TLS-terminating TCP proxy on 127.0.0.1 in front of a plain Redis; yields (port, handshakes)."""
    handshakes = []

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        handshakes.append(writer.get_extra_info("peercert"))  # None unless a client certificate came
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], handshakes
    finally:
        server.close()


def _redis_tls_context(ca_dir: Path) -> ssl.SSLContext:
    """Like a Redis with tls-auth-clients: it presents the worker certificate (serverAuth, for
    127.0.0.1) and requires a client certificate from the CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca_dir / "worker.pem", ca_dir / "worker-key.pem")
    context.load_verify_locations(ca_dir / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _record(session_id: str) -> Session:
    return Session(session_id, Request(SamplingParams(seed=7), 3, 16), [5, 6, 7], GammaPolicy(), owner="w")


def test_sessions_over_rediss_with_a_password_an_acl_user_and_a_client_certificate(ca_dir, other_ca_dir):
    password = "p@ss:w/rd"  # percent-encoded in the URL
    query = (f"ssl_ca_certs={ca_dir / 'ca.pem'}&ssl_certfile={ca_dir / 'orchestrator.pem'}"
             f"&ssl_keyfile={ca_dir / 'orchestrator-key.pem'}")
    foreign_ca = f"ssl_ca_certs={other_ca_dir / 'ca.pem'}"  # Redis's certificate is not from this CA

    async def use(url: str, session_id: str, retry_s: float = 10.0):
        check_redis_url(url)
        store = SessionStore.from_url(url, ttl_s=60, retry_s=retry_s)
        try:
            await store.create(_record(session_id))
            return await store.load(session_id)
        finally:
            await store.close()

    async def main(redis: EmbeddedRedis):
        import redis as redis_py

        admin = redis_py.asyncio.Redis(port=redis.port, password=password)
        await admin.execute_command("ACL", "SETUSER", "tandem", "on", ">tandem-pw", "~tandem:*", "+@all")
        await admin.aclose()
        async with _tls_proxy(_redis_tls_context(ca_dir), redis.port) as (port, handshakes):
            with_password = await use(f"rediss://:{quote(password, safe='')}@127.0.0.1:{port}/0?{query}", "tls-a")
            as_user = await use(f"rediss://tandem:tandem-pw@127.0.0.1:{port}/0?{query}", "tls-b")
            with pytest.raises(StoreUnavailable, match="refused tandem's credentials"):
                await use(f"rediss://tandem:wrong@127.0.0.1:{port}/0?{query}", "tls-c")
            with pytest.raises(StoreUnavailable, match="TLS certificate"):  # at once, not after retry_s
                await asyncio.wait_for(use(f"rediss://:x@127.0.0.1:{port}/0?{foreign_ca}", "tls-d", 30), 10)
            return with_password, as_user, handshakes

    with EmbeddedRedis(password=password) as redis:
        with_password, as_user, handshakes = asyncio.run(asyncio.wait_for(main(redis), 60))
    assert with_password.tokens == as_user.tokens == [5, 6, 7]
    subjects = [dict(x[0] for x in peer["subject"]) for peer in handshakes if peer]
    assert {"commonName": "tandem-orchestrator"} in subjects  # real handshakes, with the client certificate


def test_a_redis_url_whose_tls_part_cannot_work_is_refused_at_configuration(ca_dir):
    with pytest.raises(ValueError, match="need a rediss:// URL"):
        check_redis_url(f"redis://127.0.0.1:6379/0?ssl_ca_certs={ca_dir / 'ca.pem'}")
    with pytest.raises(ValueError, match="ssl_ca_certs: cannot read /nowhere/ca.pem"):
        OrchestratorConfig(("127.0.0.1:1",), ("127.0.0.1:2",), "rediss://127.0.0.1:6380/0?ssl_ca_certs=/nowhere/ca.pem")
    with pytest.raises(ValueError, match="ssl_keyfile needs ssl_certfile"):
        check_redis_url(f"rediss://127.0.0.1:6380/0?ssl_keyfile={ca_dir / 'orchestrator-key.pem'}")
    check_redis_url(f"rediss://u:p@redis.ns.svc:6380/0?ssl_ca_certs={ca_dir / 'ca.pem'}")
