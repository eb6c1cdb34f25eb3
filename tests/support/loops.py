"""The cycle loop on real worker processes and a real Redis, without Ray, as the orchestrator's
deployment runs it: a loop over pools of workers, sessions on it, and sampled first tokens."""

import asyncio
from collections import Counter
from contextlib import asynccontextmanager

import numpy as np
import torch
from scipy.stats import chisquare

from tandem.math.params import SamplingParams
from tandem.math.sampling import warp
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.cycle import SpeculativeLoop
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.pool import WorkerPool
from tandem.orchestrator.session import Request, Session
from tandem.orchestrator.store import SessionStore

OWNER = "test-writer"


@asynccontextmanager
async def running_loop(drafts: list[str], targets: list[str], redis_url: str, eos: tuple[int, ...], **kwargs):
    """A SpeculativeLoop over pools of the given workers, once a worker of each is available."""
    pools = WorkerPool("draft", drafts, DraftClient), WorkerPool("target", targets, VerifierClient)
    store = SessionStore.from_url(redis_url)
    try:
        await asyncio.gather(*(pool.start() for pool in pools))
        await asyncio.gather(*(pool.wait_available(30) for pool in pools if pool.addresses))
        yield SpeculativeLoop(*pools, store, eos, **kwargs)
    finally:
        await asyncio.gather(*(pool.close() for pool in pools), store.close())


async def open_session(loop: SpeculativeLoop, session_id: str, prompt: list[int], params, max_tokens: int,
                       gamma: int | None, **request) -> Session:
    """A session on its prompt, with its record in Redis, as the orchestrator starts one.
    request: the rest of its Request (verification, draft_shape, tree_widths)."""
    s = Session(session_id, Request(params, len(prompt), max_tokens, gamma, **request), list(prompt), GammaPolicy(),
                owner=OWNER)
    await loop.store.create(s)
    return s


async def release(loop: SpeculativeLoop, s: Session) -> int:
    """Free the session's caches on every worker that took its calls → how many held it."""
    pools = {"draft": loop.drafts, "target": loop.targets}
    return sum(await asyncio.gather(*(pools[kind].workers[address].client.release(s.session_id, epoch=s.epoch)
                                      for kind, address in s.used)))


async def generate(loop: SpeculativeLoop, s: Session) -> list[int]:
    return [t async for cycle in loop.run(s) for t in cycle.tokens]


FIRST_TOKEN = SamplingParams(temperature=1.0, top_k=8)  # what sampled_first_tokens asks for, seed aside


def sampled_first_tokens(draft: str, target: str, redis_url: str, eos: int, prompt: list[int], seeds: int,
                         verification: str, name: str, draft_shape: str = "chain",
                         tree_rule: str = "rrsw") -> list[tuple[int, int]]:
    """Per seed 0 … seeds−1, a session on `prompt` under FIRST_TOKEN with γ = 3 and no drafting
    ahead, 16 at a time → (its first token, its first cycle's γ: a tree's nodes)."""

    async def run():
        async with running_loop([draft], [target], redis_url, (eos,), draft_ahead=False) as loop:
            slots = asyncio.Semaphore(16)

            async def one(seed):
                async with slots:
                    params = SamplingParams(FIRST_TOKEN.temperature, FIRST_TOKEN.top_k, FIRST_TOKEN.top_p, seed)
                    s = await open_session(loop, f"{name}-{seed}", prompt, params, 4, 3, verification=verification,
                                           draft_shape=draft_shape, tree_rule=tree_rule)
                    tokens = await generate(loop, s)
                    await release(loop, s)
                    return tokens[0], s.stats.per_cycle[0].gamma

            return await asyncio.gather(*(one(seed) for seed in range(seeds)))

    return asyncio.run(run())


def assert_first_tokens_follow_the_target(target_model, prompt: list[int], tokens: list[int]) -> None:
    """The tokens lie in the support of the target's FIRST_TOKEN distribution after prompt and
    pass χ² against it."""
    with torch.no_grad():
        expected = warp(target_model(torch.tensor([prompt])).logits[0, -1], FIRST_TOKEN).double().numpy()
    counts = Counter(tokens)
    support = np.flatnonzero(expected)
    assert set(counts) <= set(support.tolist())
    observed = np.array([counts[t] for t in support], dtype=float)
    assert chisquare(observed, expected[support] / expected[support].sum() * len(tokens)).pvalue > 1e-3
