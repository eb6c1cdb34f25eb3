"""Test support, not product: the cycle loop on real worker processes and a real Redis,
without Ray, as the orchestrator's deployment runs it."""

import asyncio
from contextlib import asynccontextmanager

from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.cycle import Session, SpeculativeLoop
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.pool import WorkerPool
from tandem.orchestrator.store import SessionRecord, SessionStore

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
                       gamma: int | None) -> Session:
    """A session on its prompt, with its record in Redis, as the orchestrator starts one."""
    s = Session(session_id, params, list(prompt), len(prompt), max_tokens, GammaPolicy(), fixed_gamma=gamma,
                owner=OWNER)
    await loop.store.create(SessionRecord(session_id, {}, len(prompt), list(prompt), owner=OWNER))
    return s


async def release(loop: SpeculativeLoop, s: Session) -> int:
    """Free the session's caches on every worker that took its calls → how many held it."""
    pools = {"draft": loop.drafts, "target": loop.targets}
    return sum(await asyncio.gather(*(pools[kind].workers[address].client.release(s.session_id, writer=s.owner)
                                      for kind, address in s.used)))


async def generate(loop: SpeculativeLoop, s: Session) -> list[int]:
    return [t async for cycle in loop.run(s) for t in cycle.tokens]
