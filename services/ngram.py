"""The n-gram draft worker (prompt lookup): no model. It proposes the γ tokens that followed the
latest earlier occurrence of the context's longest suffix (n from max_n down to min_n) within
the last `window` tokens, or none when nothing matches (a γ-0 cycle).

It is a DraftWorker like the model's: the same service, the same cache_len contract (its
"cache" is the session's token list, cropped and extended like a KV cache, holding the
committed tokens and a block's first γ−1 drafted ones, as the orchestrator assumes), so pools,
failover and traces treat it like any draft worker. Its drafts are one-hot: probability 1 for
the proposed token, sent as one-entry sparse distributions when the request samples; the
verifier's residual is then the target with the drafted token removed, which is exact
(docs/exactness.md, "Token-level verification": one-hot drafts). It needs no GPU: a drafter for
any CPU node.
"""

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tandem.math.params import SamplingParams
from tandem.services.batching import Job
from tandem.services.draft_worker import DraftWorkerServicer
from tandem.services.runtime import CacheMiss, Step
from tandem.wire import worker as wire

# What the worker takes: any int32 token id, contexts up to a million tokens. The orchestrator
# takes the smaller of the two workers' limits, so the target's model sets the real ones.
VOCAB_SIZE = 2**31 - 1
MAX_CONTEXT = 1 << 20
ONE_HOT = np.array([1.0], dtype="<f4").tobytes()


@dataclass(frozen=True)
class Lookup:
    min_n: int = 1
    max_n: int = 4
    window: int = 1024  # tokens of the context searched, the latest; 0: all of it

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {self.min_n} and {self.max_n}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window}")

    @property
    def name(self) -> str:
        return f"ngram(n={self.min_n}-{self.max_n}, window={self.window})"

    def propose(self, context: list[int], gamma: int) -> list[int]:
        """γ tokens that followed the latest earlier occurrence of the longest matching suffix
        of context; [] when no suffix of min_n tokens or more occurred before. Where the context
        ends fewer than γ tokens after the match, the copy runs on into its own tokens (LZ77's
        overlapping copy): text in a loop of p tokens drafts the loop on, where a copy stopped
        at the context's end drafted p at most, whatever γ the policy asked for."""
        searched = np.asarray(context[-self.window:] if self.window else context, dtype=np.int64)  # [L]
        length = len(searched)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(searched[:-1], n)  # [L−n, n]: all but the suffix
            starts = np.flatnonzero((windows == searched[-n:]).all(axis=1))
            if starts.size:
                follow = int(starts[-1]) + n  # the latest match's next token
                period = length - follow  # the suffix recurs this many tokens after its match
                return searched[follow + np.arange(gamma) % period].tolist()
        return []


class NgramRuntime:
    """Each session's committed tokens, with ModelRuntime's cache contract (crop to cache_len,
    extend, CacheMiss when holding fewer), least-recently-used sessions evicted past a bound."""

    def __init__(self, lookup: Lookup, max_tokens: int = 64 << 20) -> None:
        self.lookup = lookup
        self.max_tokens = max_tokens  # tokens held over all sessions (8 bytes each in a list)
        self.info = wire.ModelInfo(model=lookup.name,
                                   vocab_size=VOCAB_SIZE, max_context=MAX_CONTEXT, eos_token_ids=(),
                                   device="cpu", dtype="none", num_parameters=0)
        self._sessions: OrderedDict[str, list[int]] = OrderedDict()
        self._held = 0

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    @property
    def cache_bytes(self) -> int:
        return 8 * self._held

    @property
    def token_bytes(self) -> int:
        """Bytes per held token (a Python int in a list, counted as 8)."""
        return 8

    def extend_batch(self, steps: list[Step]) -> list:
        """Per step: the session's tokens after cropping to cache_len and extending (the list
        itself, for the job to read), or its CacheMiss."""
        results = []
        for step in steps:
            tokens = self._sessions.get(step.session_id)
            if tokens is None or len(tokens) < step.cache_len:
                if step.cache_len > 0:
                    results.append(CacheMiss(step.session_id))
                    continue
                tokens = self._sessions[step.session_id] = []
            self._held += step.cache_len + len(step.tokens) - len(tokens)
            del tokens[step.cache_len:]
            tokens.extend(step.tokens)
            self._sessions.move_to_end(step.session_id)
            results.append(tokens)
        self._evict(keep={step.session_id for step in steps})
        return results

    def release(self, session_id: str) -> bool:
        tokens = self._sessions.pop(session_id, None)
        if tokens is None:
            return False
        self._held -= len(tokens)
        return True

    def _evict(self, keep: set[str]) -> None:
        while self._held > self.max_tokens and (oldest := next(iter(self._sessions))) not in keep:
            self.release(oldest)


def propose(session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
            lookup: Lookup) -> Job:
    """The job that drafts up to γ tokens by lookup → a Proposal (possibly empty). Raises
    CacheMiss. Like the model's draft job, it leaves the block's first γ−1 tokens in the cache."""
    context = yield Step(session_id, cache_len, tokens)
    drafted = lookup.propose(context, gamma)
    if len(drafted) > 1:
        yield Step(session_id, len(context), drafted[:-1])
    return one_hot(drafted, params)


def one_hot(drafted: list[int], params: SamplingParams) -> wire.Proposal:
    """A proposal of drafted tokens each drawn with probability 1; sampled requests get each as
    a one-entry sparse distribution."""
    dists = [] if params.greedy else [
        wire.draft_distribution(np.array([t], dtype="<i4").tobytes(), ONE_HOT) for t in drafted]
    return wire.Proposal(drafted, [1.0] * len(drafted), dists, 0.0)


class NgramDraftServicer(DraftWorkerServicer):
    """The DraftWorker service answered by lookup."""

    def draft(self, request, params: SamplingParams) -> tuple[Job, int]:
        job = propose(request.session_id, request.cache_len, list(request.tokens), request.gamma, params,
                      self.runtime.lookup)
        return job, 0 if params.greedy else request.gamma


add_to_server = NgramDraftServicer.add_to_server
