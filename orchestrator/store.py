"""Sessions in Redis, the source of truth.

Per session two keys, both with a TTL:
- `tandem:session:{id}` (hash): request parameters, seed, cycle counter, γ-policy state, worker
  assignment and the workers' cache lengths, status;
- `tandem:session:{id}:tokens` (string): the committed sequence, prompt first, as
  little-endian int32, only ever APPENDed.
Each cycle commits in one server-side script (atomic like MULTI/EXEC, but one command and
one reply: the per-cycle client cost is a third of a six-command transaction's), before the
client sees its tokens.
"""

import json
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis


def _meta_key(session_id: str) -> str:
    return f"tandem:session:{session_id}"


def _tokens_key(session_id: str) -> str:
    return f"tandem:session:{session_id}:tokens"


# KEYS: the tokens key, the meta key. ARGV: the packed tokens, the TTL, then field/value pairs.
_COMMIT = """
redis.call('APPEND', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


def _pack(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


@dataclass
class SessionRecord:
    """What Redis holds of a session (tokens are the committed sequence, prompt included)."""

    session_id: str
    params: dict  # sampling parameters, max_tokens, requested gamma
    prompt_len: int
    tokens: list[int]
    cycle: int
    policy: dict
    workers: dict  # {"draft": address, "target": address}
    cache_lens: dict  # {"draft": n, "target": n}: soft hints, the workers may have evicted
    status: str  # "running", "stop", "length"


class SessionStore:
    def __init__(self, client: aioredis.Redis, ttl_s: int = 3600) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self._commit = client.register_script(_COMMIT)  # EVALSHA, loading the script when needed

    @classmethod
    def from_url(cls, url: str, ttl_s: int = 3600) -> "SessionStore":
        return cls(aioredis.Redis.from_url(url), ttl_s)

    async def create(self, record: SessionRecord) -> None:
        meta = {
            "params": json.dumps(record.params),
            "prompt_len": record.prompt_len,
            "cycle": record.cycle,
            "policy": json.dumps(record.policy),
            "workers": json.dumps(record.workers),
            "cache_lens": json.dumps(record.cache_lens),
            "status": record.status,
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(_meta_key(record.session_id), mapping=meta)
            pipe.set(_tokens_key(record.session_id), _pack(record.tokens))
            self._expire(pipe, record.session_id)
            await pipe.execute()

    async def commit(
        self, session_id: str, new_tokens: list[int], cycle: int, policy: dict, cache_lens: dict,
        status: str,
    ) -> None:
        """Append one cycle's output tokens and its state, atomically."""
        await self._commit(
            keys=[_tokens_key(session_id), _meta_key(session_id)],
            args=[_pack(new_tokens), self.ttl_s, "cycle", cycle, "policy", json.dumps(policy),
                  "cache_lens", json.dumps(cache_lens), "status", status],
        )

    async def load(self, session_id: str) -> SessionRecord | None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(_meta_key(session_id))
            pipe.get(_tokens_key(session_id))
            meta, packed = await pipe.execute()
        if not meta or packed is None:
            return None
        meta = {k.decode(): v.decode() for k, v in meta.items()}
        return SessionRecord(
            session_id=session_id,
            params=json.loads(meta["params"]),
            prompt_len=int(meta["prompt_len"]),
            tokens=np.frombuffer(packed, dtype="<i4").tolist(),
            cycle=int(meta["cycle"]),
            policy=json.loads(meta["policy"]),
            workers=json.loads(meta["workers"]),
            cache_lens=json.loads(meta["cache_lens"]),
            status=meta["status"],
        )

    def _expire(self, pipe, session_id: str) -> None:
        pipe.expire(_meta_key(session_id), self.ttl_s)
        pipe.expire(_tokens_key(session_id), self.ttl_s)

    async def close(self) -> None:
        await self.redis.aclose()
