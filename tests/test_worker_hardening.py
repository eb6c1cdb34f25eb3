"""Hardening of the two workers, against real `tandem worker` processes on 127.0.0.1.

- Message limits sized from the model: an oversized message is answered RESOURCE_EXHAUSTED by
  gRPC before the worker parses it, and the largest valid request still fits.
- Memory: the worker's RSS stays within a stated bound after oversized messages and after
  large valid requests (measured figures in services/memory.py).
- Bad input: a corpus of malformed and extreme requests on every RPC answers a clear status
  naming the field (never INTERNAL or UNKNOWN), and the worker keeps serving; then a bounded
  hypothesis fuzz of the same kind.
- Ports: loopback by default; a taken gRPC or metrics port is one line, no traceback.

The model is a tiny random Llama with a real vocabulary size (32000) and context (4096), so
that full-vocabulary distributions and full-context prefills are as large as a real pair's.
"""

import math
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.local import LocalCluster
from tandem.math.params import SamplingParams
from tandem.ports import free_port, port_in_use
from tandem.services.limits import message_limits
from tandem.v1 import sampling_pb2, worker_pb2
from tandem.wire import worker as wire

from support.models import llama_config, save_random_model

VOCAB, MAX_CONTEXT = 32000, 4096
TIMEOUT_S = 60
START_TIMEOUT_S = 180  # two workers importing torch at once on two busy cores
SERVICE = {"draft": "tandem.v1.DraftWorker", "target": "tandem.v1.TargetVerifier"}
MAIN_RPC = {"draft": "Propose", "target": "Verify"}
# What a refused request may answer; INTERNAL and UNKNOWN never.
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED}
MIB = 1 << 20
# RSS bounds (why: services/memory.py). Oversized messages: +11 to +48 MiB measured while the
# sending connection is open (gRPC's buffers), +200 MiB after twenty without one arena, ~470 MiB
# per message without the size limit. Large valid calls: +14/+15 MiB measured after ten, +70 and
# +185 MiB without the fixes.
OVERSIZED_BOUND, LARGE_BOUND, FUZZ_BOUND = 64 * MIB, 48 * MIB, 64 * MIB
FUZZ_EXAMPLES = 60  # per worker: a count, not a time budget, so slow machines test as much


# --- wire bytes, written by hand so that any field can hold any value -----------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32s travel as 10-byte varints, like protobuf's own
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def f_varint(field: int, n: int) -> bytes:
    return varint(field << 3) + varint(n)


def f_bytes(field: int, data: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_double(field: int, x: float) -> bytes:
    return varint(field << 3 | 1) + struct.pack("<d", x)


def sampling(temperature: float = 0.0, **kw) -> sampling_pb2.SamplingParams:
    return wire.sampling_to_pb(SamplingParams(temperature=temperature, **kw))


def dist(ids: list[int] | None, probs) -> sampling_pb2.DraftDistribution:
    token_ids = np.asarray(ids, dtype="<i4").tobytes() if ids is not None else b""
    return wire.draft_distribution(token_ids, np.asarray(probs, dtype="<f4").tobytes())


UNIFORM = [1 / VOCAB] * VOCAB
SAMPLED = sampling(1.0, seed=3)


def propose(**kw) -> bytes:
    fields = dict(session_id="p", cache_len=0, tokens=[5, 6, 7], gamma=2, sampling=sampling()) | kw
    return worker_pb2.ProposeRequest(**fields).SerializeToString()


def verify(**kw) -> bytes:
    fields = dict(session_id="v", cache_len=0, tokens=[5, 6, 7], draft_tokens=[8, 9], sampling=sampling()) | kw
    return worker_pb2.VerifyRequest(**fields).SerializeToString()


def sampled_verify(**kw) -> bytes:
    return verify(**({"sampling": SAMPLED, "draft_distributions": [dist(None, UNIFORM)] * 2} | kw))


# --- worker processes -----------------------------------------------------------------------


class Worker:
    """A `tandem worker` child process, its address and a channel to it (no client-side limits:
    the worker's own must refuse)."""

    def __init__(self, kind: str, model: str, metrics_port: int, args: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.metrics_port = metrics_port
        cmd = [sys.executable, "-m", "tandem.cli", "worker", kind, "--model", model, "--port", "0", "--threads", "1",
               "--metrics-port", str(metrics_port), "--parent-pid", str(os.getpid()), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready_line = ""
        self.channel = None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # EOF

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "listening on" not in self.ready_line:
            line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line, f"{self.kind} worker exited with {self.proc.wait(timeout=10)} before listening"
            self.ready_line = line
        address = self.ready_line.split("listening on ")[1].split()[0]
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                               ("grpc.max_receive_message_length", -1)])
        grpc.channel_ready_future(self.channel).result(timeout=TIMEOUT_S)

    @property
    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def raw(self, rpc: str, payload: bytes, service: str | None = None) -> bytes:
        method = f"/{service or SERVICE[self.kind]}/{rpc}"
        return self.channel.unary_unary(method, request_serializer=None, response_deserializer=None)(
            payload, timeout=TIMEOUT_S)

    def raw_stream(self, rpc: str, payloads: list[bytes]) -> list[bytes]:
        call = self.channel.stream_stream(f"/{SERVICE[self.kind]}/{rpc}", request_serializer=None,
                                          response_deserializer=None)
        return list(call(iter(payloads), timeout=TIMEOUT_S))

    def assert_serving(self) -> None:
        """The worker is alive and answers a valid request."""
        assert self.proc.poll() is None, f"{self.kind} worker died"
        if self.kind == "draft":
            answer = worker_pb2.ProposeResponse.FromString(self.raw("Propose", propose(session_id="alive")))
            assert len(answer.draft_tokens) == 2
        else:
            answer = worker_pb2.VerifyResponse.FromString(self.raw("Verify", verify(session_id="alive")))
            assert len(answer.recovered_tokens) == 2

    def stop(self) -> None:
        if self.channel:
            self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config = llama_config(vocab_size=VOCAB, layers=1, hidden=32, eos_token_id=2, max_context=MAX_CONTEXT)
    return save_random_model(config, str(tmp_path_factory.mktemp("hardening") / "model"), seed=0)


@pytest.fixture(scope="module")
def workers(model_dir):
    """{"draft": Worker, "target": Worker}, started together."""
    started = {kind: Worker(kind, model_dir, free_port()) for kind in ("draft", "target")}
    try:
        for worker in started.values():
            worker.wait_ready()
        yield started
    finally:
        for worker in started.values():
            worker.stop()


def status(fn, *args) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


# --- binding and ports ----------------------------------------------------------------------


def test_ready_line_states_the_limits_and_everything_binds_loopback(workers):
    for kind, worker in workers.items():
        limits = message_limits(kind, VOCAB, MAX_CONTEXT)
        assert worker.ready_line.startswith(f"tandem {kind} worker listening on 127.0.0.1:")
        assert f"max_request_bytes={limits.receive} max_response_bytes={limits.send}" in worker.ready_line
        listening = {c.laddr.port: c.laddr.ip for c in psutil.Process(worker.proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert listening[worker.metrics_port] == "127.0.0.1", listening
        assert set(listening.values()) <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def test_worker_host_defaults_to_loopback():
    from tandem.cli import parser

    assert parser().parse_args(["worker", "draft", "--model", "m"]).host == "127.0.0.1"


def test_a_session_the_kv_cache_cannot_hold_is_refused_and_the_worker_serves_on(model_dir):
    """--max-cache-mb 0 leaves the pool one block (16 tokens): a longer sequence gets
    RESOURCE_EXHAUSTED naming its tokens, and the ready line states what a token holds."""
    worker = Worker("target", model_dir, 0, ("--max-cache-mb", "0"))
    try:
        worker.wait_ready()
        assert "max_cache_bytes=0" in worker.ready_line
        token_bytes = int(worker.ready_line.split("kv_bytes_per_token=")[1].split()[0])
        assert token_bytes == 1 * 2 * 1 * 32 * 4  # layers × keys and values × KV heads × head dim × float32
        code, details = status(worker.raw, "Verify", verify(session_id="long", tokens=list(range(3, 20))))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("tokens: "), details
        answer = worker_pb2.VerifyResponse.FromString(worker.raw("Verify", verify(session_id="short")))
        assert len(answer.recovered_tokens) == 2
    finally:
        worker.stop()


def test_a_taken_port_is_one_line(model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runs = {what: subprocess.Popen([sys.executable, "-m", "tandem.cli", "worker", "draft", "--model", model_dir,
                                        *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for what, args in (("gRPC", ["--port", str(port)]),
                                   ("metrics", ["--port", "0", "--metrics-port", str(port)]))}
        for what, run in runs.items():
            try:
                out, err = run.communicate(timeout=START_TIMEOUT_S)
            finally:
                run.kill()
            assert run.returncode != 0 and "Traceback" not in err, err
            assert f"tandem worker: port {port} ({what}) on 127.0.0.1 is in use" in err.splitlines(), err


def test_local_cluster_moves_a_taken_metrics_port_only_when_told():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]  # the draft worker's: metrics_port + 1
        fixed = LocalCluster("d", "t", 0, metrics_port=port - 1, echo=False)
        with pytest.raises(RuntimeError, match=f"port {port} \\(draft-0 metrics\\) on 127.0.0.1 is in use"):
            fixed._check_metrics_ports(free_port)
        moved = LocalCluster("d", "t", 0, metrics_port=port - 1, echo=False, metrics_fallback=True)
        moved._check_metrics_ports(free_port)
        assert moved.metrics_ports["draft-0"] not in (0, port)
        assert moved.metrics_ports["target-0"] == port + 1
        assert moved.metrics_ports["orchestrator"] == port - 1 or port_in_use("127.0.0.1", port - 1)


# --- message limits and memory --------------------------------------------------------------


def test_the_largest_valid_requests_fit(workers):
    """A request as large as a valid one can be is not refused for its size."""
    session = "\U0001f600" * 128  # 128 characters of 4 bytes of UTF-8
    trace = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "baggage": "k=" + "v" * 8000}
    draft = propose(session_id=session, tokens=[VOCAB - 1] * (MAX_CONTEXT - 1), gamma=1, trace_context=trace)
    assert workers["draft"].raw("Propose", draft)
    # Sparse distributions naming every token: 8 bytes per vocabulary entry, the most a valid one takes.
    full = dist(list(range(VOCAB)), UNIFORM)
    target = verify(session_id=session, tokens=[VOCAB - 1] * (MAX_CONTEXT - 64), draft_tokens=[VOCAB - 1] * 64,
                    sampling=SAMPLED, draft_distributions=[full] * 64, trace_context=trace)
    assert len(target) > 16 * 10**6
    assert workers["target"].raw("Verify", target)


def test_oversized_messages_are_refused_before_they_are_allocated(workers):
    garbage = os.urandom(50_000_000)
    tokens = worker_pb2.ProposeRequest(session_id="big", tokens=[5] * 50_000_000, gamma=1).SerializeToString()
    for kind, payloads in (("draft", [tokens] * 10 + [garbage] * 10), ("target", [garbage] * 10)):
        worker = workers[kind]
        before = worker.rss
        for payload in payloads:
            code, details = status(worker.raw, MAIN_RPC[kind], payload)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        time.sleep(0.5)
        assert worker.rss <= before + OVERSIZED_BOUND, (kind, before / MIB, worker.rss / MIB)
        worker.assert_serving()


def test_large_valid_requests_give_their_memory_back(workers):
    rng = np.random.default_rng(0)
    draft, target = workers["draft"], workers["target"]
    probs = rng.random((64, VOCAB), dtype=np.float32)
    dense = [dist(None, row / row.sum()) for row in probs]
    before = {"draft": draft.rss, "target": target.rss}
    for i in range(10):
        prefill = rng.integers(3, VOCAB, MAX_CONTEXT - 4).tolist()
        draft.raw("Propose", propose(session_id=f"big{i}", tokens=prefill, gamma=4, sampling=sampling(1.0, seed=i)))
        draft.raw("Release", worker_pb2.ReleaseRequest(session_id=f"big{i}").SerializeToString())
        request = sampled_verify(session_id=f"big{i}", tokens=rng.integers(3, VOCAB, MAX_CONTEXT - 65).tolist(),
                                 draft_tokens=rng.integers(3, VOCAB, 64).tolist(), draft_distributions=dense)
        target.raw("Verify", request)
        target.raw("Release", worker_pb2.ReleaseRequest(session_id=f"big{i}").SerializeToString())
    time.sleep(0.5)  # the trim runs 0.1 s after the last large call
    for kind, worker in workers.items():
        assert worker.rss <= before[kind] + LARGE_BOUND, (kind, before[kind] / MIB, worker.rss / MIB)


# --- the bad-input corpus -------------------------------------------------------------------

INVALID, OUT_OF_RANGE, OK = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.OK


def _sequence_cases(make, tokens_field: int, sampling_field: int) -> dict:
    """Cases both Propose and Verify share: (payload, expected code, text the details must hold)."""
    base = make()
    temperatures = {"nan": math.nan, "inf": math.inf, "1e-45": 1e-45, "1e300": 1e300, "negative": -1.0}
    cases = {f"temperature-{name}": (make(sampling=sampling(t)), INVALID, "sampling.temperature")
             for name, t in temperatures.items()}
    return cases | {
        "top_p-1e-12": (make(sampling=sampling(1.0, top_p=1e-12)), OK, ""),
        "top_p-nan": (make(sampling=sampling(1.0, top_p=math.nan)), INVALID, "sampling.top_p"),
        "top_k-2^31-1": (make(sampling=sampling(1.0, top_k=2**31 - 1)), OK, ""),
        "top_k-2^31": (base + f_bytes(sampling_field, f_double(1, 1.0) + f_varint(2, 2**31)), INVALID,
                       "sampling.top_k"),
        "top_k-2^63": (base + f_bytes(sampling_field, f_double(1, 1.0) + f_varint(2, 2**63)), OK, ""),  # int32: 0
        "seed-2^64-1": (make(sampling=sampling(1.0, seed=2**64 - 1)), OK, ""),
        "cache_len-2^31": (make(cache_len=2**31), OUT_OF_RANGE, "tokens"),
        "cache_len-2^32-1": (make(cache_len=2**32 - 1), OUT_OF_RANGE, "tokens"),
        "cache_len-2^63": (base + f_varint(2, 2**63 + 2**31), OUT_OF_RANGE, "tokens"),  # uint32: 2^31
        "token-2^31": (base + f_bytes(tokens_field, varint(2**31)), INVALID, "tokens[3]"),  # int32: -2^31
        "token-2^31-1": (make(tokens=[2**31 - 1]), INVALID, "tokens[0]"),
        "token-negative": (make(tokens=[-(2**31)]), INVALID, "tokens[0]"),
        "token-vocab": (make(tokens=[5, VOCAB]), INVALID, "tokens[1]"),
        "tokens-empty": (make(tokens=[]), INVALID, "tokens"),
        "tokens-past-context": (make(tokens=[5] * (MAX_CONTEXT + 1)), OUT_OF_RANGE, "tokens"),
        "cache-and-tokens-past-context": (make(cache_len=MAX_CONTEXT, tokens=[5]), OUT_OF_RANGE, "tokens"),
        "session-empty": (make(session_id=""), INVALID, "session_id"),
        "session-129": (make(session_id="x" * 129), INVALID, "session_id"),
        "session-20MB": (make(session_id="x" * (20 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        "session-bad-utf8": (base + f_bytes(1, b"\xff\xfe"), INVALID, "request: not a valid message"),
        "unknown-fields": (base + f_varint(99, 7) + f_bytes(100, b"x" * 1000), OK, ""),
        "trace-context-junk": (make(trace_context={"traceparent": "00-zz", "x" * 100: "y" * 1000}), OK, ""),
        "garbage-4": (b"\xff\xff\xff\xff", INVALID, "request: not a valid message"),
        "garbage-truncated": (b"\x0a\xff\xff\xff\xff\x0f", INVALID, "request: not a valid message"),
        "garbage-1k": (bytes(range(256)) * 4, INVALID, "request: not a valid message"),
        "empty-message": (b"", INVALID, "session_id"),
    }


PROPOSE_CASES = _sequence_cases(propose, 3, 5) | {
    "gamma-0": (propose(gamma=0), INVALID, "gamma"),
    "gamma-65": (propose(gamma=65), INVALID, "gamma"),
    "gamma-2^31": (propose(gamma=2**31), INVALID, "gamma"),
    "gamma-2^32-1": (propose(gamma=2**32 - 1), INVALID, "gamma"),
    "gamma-2^63": (propose() + f_varint(4, 2**63), INVALID, "gamma"),  # uint32: 0
    "gamma-past-context": (propose(tokens=[5] * (MAX_CONTEXT - 1), gamma=3), OUT_OF_RANGE, "gamma"),
    "ahead-guesses-3": (propose(ahead=True, ahead_guesses=3), OK, ""),
    "ahead-guesses-not-ahead": (propose(ahead_guesses=3), INVALID, "ahead_guesses"),
    "ahead-tree": (propose(ahead=True, ahead_guesses=2, tree_widths=[2, 1]), INVALID, "tree_widths"),
    "ahead-guesses-65-nodes": (propose(ahead=True, ahead_guesses=13, gamma=5), INVALID, "ahead_guesses"),
    "ahead-guesses-2^32-1": (propose(ahead=True, ahead_guesses=2**32 - 1), INVALID, "ahead_guesses"),
    "ahead-guesses-past-context": (propose(tokens=[5] * (MAX_CONTEXT - 6), gamma=2, ahead=True, ahead_guesses=4),
                                   OUT_OF_RANGE, "gamma"),
    "ahead-rejections-2": (propose(ahead=True, ahead_block=2, ahead_rejections=2, ahead_guesses=2), OK, ""),
    "ahead-rejections-not-ahead": (propose(ahead_block=2, ahead_rejections=1), INVALID, "ahead_block"),
    "ahead-rejections-past-block": (propose(ahead=True, ahead_block=1, ahead_rejections=2), INVALID,
                                    "ahead_rejections"),
    "ahead-block-without-its-token": (propose(ahead=True, ahead_block=3, ahead_rejections=1), INVALID, "ahead_block"),
    "ahead-rejections-65-nodes": (propose(tokens=[5] * 10, ahead=True, ahead_block=8, ahead_rejections=8, gamma=8),
                                  INVALID, "ahead_guesses"),
    "ahead-rejections-2^32-1": (propose(ahead=True, ahead_block=2, ahead_rejections=2**32 - 1), INVALID,
                                "ahead_rejections"),
}

VERIFY_CASES = _sequence_cases(sampled_verify, 3, 6) | {
    "draft-token-2^31": (verify() + f_bytes(4, varint(2**31)), INVALID, "draft_tokens[2]"),
    "draft-token-vocab": (verify(draft_tokens=[8, VOCAB]), INVALID, "draft_tokens[1]"),
    "draft-tokens-65": (verify(draft_tokens=[8] * 65), INVALID, "draft_tokens"),
    "draft-past-context": (verify(tokens=[5] * (MAX_CONTEXT - 1)), OUT_OF_RANGE, "draft_tokens"),
    "sampled-without-distributions": (verify(sampling=SAMPLED), INVALID, "draft_distributions"),
    "distribution-count": (sampled_verify(draft_distributions=[dist(None, UNIFORM)]), INVALID,
                           "draft_distributions"),
    "dense-short": (sampled_verify(draft_distributions=[dist(None, UNIFORM[:-1])] * 2), INVALID,
                    "draft_distributions"),
    "dense-long": (sampled_verify(draft_distributions=[dist(None, UNIFORM + [0.0])] * 2), INVALID,
                   "draft_distributions"),
    "dense-ragged-bytes": (sampled_verify(draft_distributions=[wire.draft_distribution(b"", b"\0" * 5)] * 2),
                           INVALID, "draft_distributions"),
    "nan-probs": (sampled_verify(draft_distributions=[dist(None, [math.nan] * VOCAB)] * 2), INVALID,
                  "draft_distributions"),
    "inf-probs": (sampled_verify(draft_distributions=[dist([8], [math.inf])] * 2), INVALID, "draft_distributions"),
    "negative-prob": (sampled_verify(draft_distributions=[dist([8, 9], [1.5, -0.5])] * 2), INVALID,
                      "draft_distributions"),
    "id-outside-vocab": (sampled_verify(draft_distributions=[dist([8, VOCAB], [0.5, 0.5])] * 2), INVALID,
                         "draft_distributions"),
    "id-negative": (sampled_verify(draft_distributions=[dist([-1, 8], [0.5, 0.5])] * 2), INVALID,
                    "draft_distributions"),
    "id-2^31-1": (sampled_verify(draft_distributions=[dist([2**31 - 1], [1.0])] * 2), INVALID,
                  "draft_distributions"),
    "ids-and-probs-differ": (sampled_verify(draft_distributions=[dist([8, 9, 10], [0.5, 0.5])] * 2), INVALID,
                             "draft_distributions"),
    "ragged-id-bytes": (sampled_verify(draft_distributions=[wire.draft_distribution(b"\x08\0\0", b"\0\0\x80\x3f")]
                                       * 2), INVALID, "draft_distributions"),
    "all-zero-probs": (sampled_verify(draft_distributions=[dist(None, [0.0] * VOCAB)] * 2), OK, ""),
    "greedy-with-distributions": (verify(draft_distributions=[dist(None, UNIFORM)] * 2), OK, ""),
    "no-draft-block": (verify(draft_tokens=[]), OK, ""),
    "next-block-from-a-verifier-that-does-not-draft": (verify(next_gamma=2), INVALID, "next_gamma"),
}

OTHER_CASES = {  # (rpc, payload, code, text), on both workers
    "Release-garbage": ("Release", b"\xff", INVALID, "request: not a valid message"),
    "Release-empty-session": ("Release", b"", INVALID, "session_id"),
    "Release-session-200": ("Release", f_bytes(1, b"y" * 200), INVALID, "session_id"),
    "Release-bad-utf8": ("Release", f_bytes(1, b"\xff\xfe"), INVALID, "request: not a valid message"),
    "Release-unknown-session": ("Release", f_bytes(1, b"nobody"), OK, ""),
    "Describe-garbage": ("Describe", b"\xff\xff", INVALID, "request: not a valid message"),
    "Describe-unknown-field": ("Describe", f_varint(5, 2**63), OK, ""),
    "Load-garbage": ("Load", b"\x0a\xff", INVALID, "request: not a valid message"),
    "Load-random-bytes": ("Load", bytes(range(7, 250)), INVALID, "request: not a valid message"),
    "Load": ("Load", b"", OK, ""),
}


def _check(worker: Worker, code: grpc.StatusCode, details: str, expected: grpc.StatusCode, text: str) -> None:
    assert code == expected and text in details, f"{code}: {details}"
    worker.assert_serving()


@pytest.mark.parametrize("kind,name", [("draft", n) for n in PROPOSE_CASES] + [("target", n) for n in VERIFY_CASES])
def test_bad_requests_name_the_field(workers, kind, name):
    payload, expected, text = (PROPOSE_CASES if kind == "draft" else VERIFY_CASES)[name]
    worker = workers[kind]
    _check(worker, *status(worker.raw, MAIN_RPC[kind], payload), expected, text)
    # The same on a stream, after a valid request on it.
    valid = propose(session_id="streamed") if kind == "draft" else verify(session_id="streamed")
    _check(worker, *status(worker.raw_stream, MAIN_RPC[kind] + "Stream", [valid, payload]), expected, text)


@pytest.mark.parametrize("kind", ["draft", "target"])
@pytest.mark.parametrize("name", list(OTHER_CASES))
def test_bad_requests_on_the_other_rpcs(workers, kind, name):
    rpc, payload, expected, text = OTHER_CASES[name]
    _check(workers[kind], *status(workers[kind].raw, rpc, payload), expected, text)


def test_garbage_health_check_is_invalid_argument(workers):
    code, details = status(workers["draft"].raw, "Check", b"\xff\xff", "grpc.health.v1.Health")
    _check(workers["draft"], code, details, INVALID, "request: not a valid message")


# --- the fuzz -------------------------------------------------------------------------------

EDGE_INTS = [0, 1, 2, 3, 64, 65, VOCAB - 1, VOCAB, MAX_CONTEXT, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(0, 2**64 - 1), st.integers(-(2**31), -1))
token_ids = st.one_of(st.integers(3, 100), st.sampled_from(EDGE_INTS), st.integers(-(2**31), 2**31 - 1))
floats = st.one_of(st.sampled_from([0.0, -0.0, 1e-45, 1e-12, 1e-4, 0.5, 1.0, 1e4, 1e300]), st.floats())
distributions = st.sampled_from([
    dist(None, UNIFORM), dist([8, 9], [0.5, 0.5]), dist(None, [math.nan] * VOCAB), dist([VOCAB], [1.0]),
    dist([-5], [1.0]), dist([8], [-1.0]), wire.draft_distribution(b"\x01", b"\x02\x03"),
]).map(lambda d: d.SerializeToString()) | st.binary(max_size=64)


@st.composite
def sequence_fields(draw) -> bytes:
    """session_id, cache_len and tokens, any of them out of range."""
    session = draw(st.one_of(st.text(max_size=140).map(str.encode), st.binary(max_size=40)))
    tokens = draw(st.one_of(st.lists(token_ids, max_size=12),
                            st.sampled_from([MAX_CONTEXT - 1, MAX_CONTEXT + 1]).map(lambda n: [5] * n)))
    return (f_bytes(1, session) + f_varint(2, draw(st.sampled_from([0, 0, 3]) | ints))
            + f_bytes(3, b"".join(varint(t) for t in tokens)))


@st.composite
def sampling_field(draw, field: int) -> bytes:
    params = (f_double(1, draw(floats)) + f_varint(2, draw(st.sampled_from([0, 5]) | ints))
              + f_double(3, draw(st.sampled_from([1.0, 0.9]) | floats)) + f_varint(4, draw(ints)))
    return f_bytes(field, params)


@st.composite
def proposals(draw) -> bytes:
    return draw(sequence_fields()) + f_varint(4, draw(st.integers(1, 4) | ints)) + draw(sampling_field(5))


@st.composite
def verifications(draw) -> bytes:
    block = draw(st.lists(token_ids, max_size=4))
    dists = b"".join(f_bytes(5, d) for d in draw(st.lists(distributions, max_size=4)))
    return draw(sequence_fields()) + f_bytes(4, b"".join(varint(t) for t in block)) + dists + draw(sampling_field(6))


@st.composite
def mangled(draw, requests) -> bytes:
    """A request, sometimes cut short, with a byte changed or followed by junk."""
    payload = draw(requests)
    how = draw(st.sampled_from(["as is", "as is", "cut", "flip", "junk"]))
    if how == "cut":
        return payload[:draw(st.integers(0, len(payload)))]
    if how == "flip" and payload:
        at = draw(st.integers(0, len(payload) - 1))
        return payload[:at] + bytes([payload[at] ^ draw(st.integers(1, 255))]) + payload[at + 1:]
    return payload + (draw(st.binary(max_size=32)) if how == "junk" else b"")


@pytest.mark.parametrize("kind", ["draft", "target"])
def test_fuzz(workers, kind):
    """Malformed and extreme requests, unary and on streams: a refusal or an answer, never
    INTERNAL or UNKNOWN; the worker serves afterwards, its memory bounded."""
    worker = workers[kind]
    # Valid requests among the fuzzed ones: each must still get its answer.
    valid = [propose(session_id=f"ok{i}") for i in range(3)] if kind == "draft" else \
        [verify(session_id="ok0"), sampled_verify(session_id="ok1")]
    requests = st.one_of(mangled(proposals() if kind == "draft" else verifications()), st.sampled_from(valid))
    before = worker.rss
    seen = {}

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(payloads=st.lists(requests, min_size=1, max_size=3), streamed=st.booleans())
    def run(payloads, streamed):
        if streamed:
            code, details = status(worker.raw_stream, MAIN_RPC[kind] + "Stream", payloads)
        else:
            code, details = status(worker.raw, MAIN_RPC[kind], payloads[0])
        seen[code] = seen.get(code, 0) + 1
        assert code == grpc.StatusCode.OK or code in REFUSALS, f"{code}: {details}"

    run()
    assert sum(seen.values()) >= 50 and grpc.StatusCode.OK in seen, seen
    worker.assert_serving()
    assert worker.rss <= before + FUZZ_BOUND, (before / MIB, worker.rss / MIB)
