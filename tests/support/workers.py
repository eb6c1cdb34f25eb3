"""A draft worker and a target verifier served in this process: grpc.aio servers on a background
event loop, the small random models they serve, and their calls made with synchronous stubs (so
that no async test plugin is needed)."""

import asyncio
import threading

import grpc
import torch

from tandem.math.params import SamplingParams
from tandem.wire import worker as wire

from support.models import llama_config

VOCAB = 96
MAX_CONTEXT = 128
EOS = 2
TIMEOUT_S = 30
GREEDY = SamplingParams(temperature=0.0, seed=0)


def worker_config():
    """The workers' models: two layers of 64 over VOCAB tokens (each test saves its own weights)."""
    return llama_config(vocab_size=VOCAB, layers=2, hidden=64, eos_token_id=EOS, max_context=MAX_CONTEXT)


class BackgroundLoop:
    """One asyncio loop in a daemon thread: grpc.aio servers are bound to the loop they start on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-servers", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def prompt(n: int, seed: int) -> list[int]:
    """Deterministic token ids below VOCAB, avoiding the special ids 0..2."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def propose(stub, session_id, cache_len, tokens, gamma, params=GREEDY) -> wire.Proposal | None:
    request = wire.propose_request(session_id, cache_len, tokens, gamma, params)
    return wire.proposal_from_pb(stub.Propose(request, timeout=TIMEOUT_S))


def verify(stub, session_id, cache_len, tokens, proposal, params=GREEDY, verification="token",
           ) -> wire.Verification | None:
    request = wire.verify_request(session_id, cache_len, tokens, proposal, params, verification=verification)
    return wire.verification_from_pb(stub.Verify(request, timeout=TIMEOUT_S))


def block(draft_tokens: list[int]) -> wire.Proposal:
    """A greedy draft block as the draft worker would return it (no distributions)."""
    return wire.Proposal(list(draft_tokens), [1.0] * len(draft_tokens), [], 0.0)


def assert_status(excinfo, code: grpc.StatusCode, field: str) -> None:
    err = excinfo.value
    assert err.code() == code, f"{err.code()}: {err.details()}"
    assert field in err.details(), err.details()
