"""The cycle loop without Ray: real workers and Redis, with caches lost mid-generation."""

import asyncio

import torch

from orchestrator.clients import DraftClient, VerifierClient
from orchestrator.cycle import Session, SpeculativeLoop
from orchestrator.policy import GammaPolicy
from orchestrator.store import SessionRecord, SessionStore
from tandem.sampling import SamplingParams


def test_lost_worker_caches_are_re_prefilled_and_output_stays_exact(workers, redis_url, pair, target_model):
    prompt = pair["prompts"][6]
    with torch.no_grad():
        expected = target_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt):]

    async def run():
        draft, target = DraftClient(workers["draft"]), VerifierClient(workers["target"])
        store = SessionStore.from_url(redis_url)
        loop = SpeculativeLoop(draft, target, store, (pair["eos"],))
        s = Session("loop-test", SamplingParams(temperature=0.0), list(prompt), len(prompt), 20, GammaPolicy(),
                    fixed_gamma=3)
        await store.create(SessionRecord(s.session_id, {}, len(prompt), list(prompt), 0, {}, {}, {}, "running"))
        out, dropped = [], {"draft": 0, "target": 0}
        async for cycle in loop.run(s):
            out.extend(cycle.tokens)
            # Both workers forget the session (eviction, restart, another replica): the next
            # cycle's cache_len > 0 meets a miss and the whole sequence is re-sent. (The next
            # cycle's draft call is already under way: it may land before or after the loss.)
            dropped["draft"] += await draft.release(s.session_id)
            dropped["target"] += await target.release(s.session_id)
        record = await store.load(s.session_id)
        await asyncio.gather(draft.close(), target.close(), store.close())
        return out, record, s, dropped

    out, record, s, dropped = asyncio.run(run())
    assert dropped["draft"] >= s.cycle // 2 and dropped["target"] == s.cycle
    assert out == expected.tolist()
    assert record.tokens == prompt + out and record.cycle == s.cycle
