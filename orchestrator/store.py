"""Sessions in Redis, the source of truth.

Per session three keys, all with a TTL:
- `tandem:session:{id}` (hash): the request, frozen, and the session's progress (cycle counter,
  status, owner and writer epoch, workers and their cache lengths, the γ policy's own numbers,
  TTFT), in named fields (tandem.orchestrator.session has the codec);
- `tandem:session:{id}:tokens` (string): the committed sequence, prompt first, as
  little-endian int32, only ever APPENDed;
- `tandem:session:{id}:cycle_stats` (string): each committed cycle's counts and time split,
  packed, only ever APPENDed (a resumed session's stats cover the whole generation). Versions
  before the wait split kept 12 fields under `:cycles`; a session resumed across that upgrade
  reports the cycles after it.

A session has one writer at a time. Each cycle commits in one server-side script, before the
client sees its tokens, and only if the writer still owns the session (`owner`, which a
resume takes over) and the session is at the cycle before it: a stale writer stops, and a
token is committed exactly once. A commit retried after a lost reply finds its own cycle
already there and succeeds without writing twice. The commits a replica's sessions make in
one turn of its event loop travel to Redis in one round trip (tandem.orchestrator.turns: one
call of the script over all of them, each commit fenced and answered on its own). Redis faults
are retried for a bounded time, then reported as `StoreUnavailable`.

Redis over TLS is a rediss:// URL; redis-py reads the TLS files from its query string (a
password or an ACL user goes before the host, percent-encoded):

    rediss://[USER]:PASSWORD@HOST:6380/0?ssl_ca_certs=/etc/tandem/redis/ca.pem
        &ssl_certfile=/etc/tandem/redis/client.pem&ssl_keyfile=/etc/tandem/redis/client-key.pem

ssl_ca_certs: the CA that signed Redis's certificate (default: the system's); ssl_certfile and
ssl_keyfile: a client certificate, for a Redis started with tls-auth-clients; the server's
certificate is always verified, and for the URL's host unless `ssl_check_hostname=false`.
"""

import asyncio
import logging
import os
import ssl
import struct
import time
from dataclasses import fields
from operator import attrgetter
from urllib.parse import parse_qs, urlparse

import msgpack
import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tandem.orchestrator.session import Session, SessionRecord
from tandem.orchestrator.turns import Turn
from tandem.wire.generation import CycleStats

log = logging.getLogger("tandem.orchestrator")

FINISHED = ("stop", "length")  # statuses of a session that has generated all it will
# One CycleStats, in its field order: gamma, accepted, output tokens, start, the six time
# parts (draft, verify, transport, redis, orchestration as float64 ms), wire bytes, drafted
# ahead, ahead ms, wait ms.
_CYCLE = struct.Struct("<3I6dI?2d")
_REDIS_MS_AT = struct.calcsize("<3I4d")  # where redis_ms sits in a packed cycle
_CYCLE_VALUES = attrgetter(*(f.name for f in fields(CycleStats)))  # dataclasses.astuple, without its deep copy


def check_redis_url(url: str) -> None:
    """ValueError, at configuration time, for a URL whose TLS part cannot work: ssl_*
    parameters on a plain redis:// URL, or a TLS file it names that cannot be read."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    tls = [name for name in query if name.startswith("ssl_")]
    if tls and parsed.scheme != "rediss":
        raise ValueError(f"redis_url: {', '.join(tls)} need a rediss:// URL")
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        for path in query.get(name, []):
            if not os.access(path, os.R_OK):
                raise ValueError(f"redis_url: {name}: cannot read {path}")
    if "ssl_keyfile" in query and "ssl_certfile" not in query:
        raise ValueError("redis_url: ssl_keyfile needs ssl_certfile")


def _keys(session_id: str) -> list[str]:
    meta = f"tandem:session:{session_id}"
    return [meta, f"{meta}:tokens", f"{meta}:cycle_stats"]


# A turn's commits, each fenced and answered on its own. KEYS: per commit, its session's meta,
# tokens and cycles keys. ARGV[1]: the TTL; ARGV[2]: the commits (msgpack), each [owner, cycle,
# packed tokens, packed cycle, the offset and packed value of the cycle before's Redis time ('' '':
# none), then field, value, …]. Returns per commit 1 (committed), 2 (this cycle was already
# committed by this owner: a retry), 0 (another writer owns the session, or it is at another
# cycle), -1 (no session), -2 (stopped: no writer owns it).
_COMMIT = """
local function commit(meta, tokens, cycles, c, ttl)
  if redis.call('EXISTS', meta) == 0 then return -1 end
  local state = redis.call('HMGET', meta, 'owner', 'cycle')
  if state[1] == '' then return -2 end
  if state[1] ~= c[1] then return 0 end
  local at, cycle = tonumber(state[2]), tonumber(c[2])
  if at == cycle then return 2 end
  if at ~= cycle - 1 then return 0 end
  redis.call('APPEND', tokens, c[3])
  redis.call('APPEND', cycles, c[4])
  if c[5] ~= '' then redis.call('SETRANGE', cycles, tonumber(c[5]), c[6]) end
  redis.call('HSET', meta, 'cycle', c[2], unpack(c, 7))
  for _, key in ipairs({meta, tokens, cycles}) do redis.call('EXPIRE', key, ttl) end
  return 1
end
local results = {}
for i, c in ipairs(cmsgpack.unpack(ARGV[2])) do
  results[i] = commit(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], c, ARGV[1])
end
return results
"""

# KEYS: meta, tokens, cycles. ARGV: the new owner. Takes an unfinished session over (the
# writer before is fenced from its next commit on, and its worker calls by the epoch this
# bumps) and returns it: {meta pairs, tokens, cycles}, or nil when there is no such session.
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'stop' and status ~= 'length' then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'status', 'running')
  redis.call('HINCRBY', KEYS[1], 'epoch', 1)
end
return {redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or ''}
"""

# KEYS: cycles. ARGV: offset, bytes. Writes a stored cycle's Redis time, if the session's cycles
# are still there (SETRANGE alone would make a key without a TTL for a session that expired).
_AMEND = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SETRANGE', KEYS[1], ARGV[1], ARGV[2]) end
"""

# KEYS: meta. ARGV: status. Stops an unfinished session: no writer owns it any more (the one
# at it is fenced from its next commit on), and its status says why.
_STOP = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or status == 'stop' or status == 'length' or status == 'abandoned' then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'status', ARGV[1])
return 1
"""

# KEYS: meta. ARGV: owner, status. Sets how a session ended if this writer still owns it.
_FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
return 1
"""


class StoreUnavailable(Exception):
    """Redis did not answer within the store's retry bound."""


class Fenced(Exception):
    """This writer may not commit any more and must stop: `reason` is "taken over" (another
    writer owns the session now), "stopped" (Cancel) or "expired"."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} " + {"taken over": "is written by another stream"}.get(reason, reason))
        self.session_id, self.reason = session_id, reason

    def __reduce__(self):  # picklable, so it crosses Ray's process boundary intact
        return Fenced, (self.session_id, self.reason)


def _pack_tokens(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def pack_cycle(c: CycleStats) -> bytes:
    return _CYCLE.pack(*_CYCLE_VALUES(c))


def _amendment(cycle: int, redis_ms: float) -> tuple[int, bytes]:
    """Where cycle `cycle`'s (1-based) Redis time sits in the packed cycles, and its bytes."""
    return (cycle - 1) * _CYCLE.size + _REDIS_MS_AT, struct.pack("<d", redis_ms)


def unpack_cycles(packed: bytes) -> list[CycleStats]:
    return [CycleStats(*values) for values in _CYCLE.iter_unpack(packed)]


def _record(session_id: str, meta: dict, packed_tokens: bytes, packed_cycles: bytes) -> SessionRecord:
    meta = {(k.decode() if isinstance(k, bytes) else k): v.decode() for k, v in meta.items()}
    return SessionRecord.of(session_id, meta, np.frombuffer(packed_tokens, dtype="<i4").tolist(),
                            unpack_cycles(packed_cycles))


class SessionStore:
    def __init__(self, client: aioredis.Redis, ttl_s: int = 3600, retry_s: float = 10.0) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        # EVALSHA, loading the script when Redis does not know it (a restarted Redis forgets).
        self._commit = client.register_script(_COMMIT)
        self._claim = client.register_script(_CLAIM)
        self._finish = client.register_script(_FINISH)
        self._stop = client.register_script(_STOP)
        self._amend = client.register_script(_AMEND)
        # Commits made in one turn of the loop: one round trip, flushed a hop after the worker calls
        # the same turn makes (tandem.orchestrator.clients), so that packing them never delays those.
        self._commits = Turn(self._commit_all, hops=3)

    @classmethod
    def from_url(cls, url: str, ttl_s: int = 3600, retry_s: float = 10.0) -> "SessionStore":
        return cls(aioredis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0), ttl_s, retry_s)

    async def _retrying(self, call):
        """await call(), again while Redis is unreachable, for at most retry_s seconds."""
        deadline = time.monotonic() + self.retry_s
        pause = 0.05
        while True:
            try:
                return await call()
            except AuthenticationError:  # a deployment error, not an outage: say so at once
                raise StoreUnavailable("the session store refused tandem's credentials (REDIS_URL)") from None
            except (RedisConnectionError, RedisTimeoutError) as e:  # also LOADING after a restart
                # Redis's certificate fails verification: a deployment error too (a transient
                # handshake fault, e.g. a restart, is an SSLError of another kind, and retried).
                if isinstance(e.__cause__ or e.__context__, ssl.SSLCertVerificationError):
                    raise StoreUnavailable(f"the session store's TLS certificate (REDIS_URL): {e}") from None
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(f"the session store did not answer for {self.retry_s:.0f} s "
                                           f"({type(e).__name__})") from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.2)  # a restarted Redis answers within a few ms

    async def create(self, session: Session) -> None:
        """Store a new session: its request, its progress so far, and its tokens."""
        meta = session.fields(created_s=time.time())
        meta_key, tokens_key, cycles_key = _keys(session.session_id)

        async def write():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(meta_key, mapping=meta)
                pipe.set(tokens_key, _pack_tokens(session.tokens))
                pipe.set(cycles_key, b"".join(pack_cycle(c) for c in session.stats.per_cycle))
                for key in (meta_key, tokens_key, cycles_key):
                    pipe.expire(key, self.ttl_s)
                await pipe.execute()

        await self._retrying(write)

    async def commit(self, session_id: str, owner: str, cycle: int, new_tokens: list[int], stats: CycleStats,
                     state: dict, previous_redis_ms: float = 0.0) -> None:
        """Append cycle `cycle`'s tokens and stats and set the fields of `state` (the session's
        progress: Session.progress), atomically. Raises Fenced if this writer no longer owns the
        session. A cycle's Redis time is measured after its commit: `previous_redis_ms` is the
        cycle before's, written into its stored stats (0: left as it is)."""
        pairs = [str(x) for item in state.items() for x in item]
        amend = _amendment(cycle - 1, previous_redis_ms) if cycle > 1 and previous_redis_ms else ("", "")
        result = await self._commits.add(
            (_keys(session_id), [owner, str(cycle), _pack_tokens(new_tokens), pack_cycle(stats), *amend, *pairs]))
        if result <= 0:
            raise Fenced(session_id, {0: "taken over", -1: "expired", -2: "stopped"}[result])

    async def _commit_all(self, commits: list[tuple[list[str], list]]) -> list[int]:
        """A turn's commits (tandem.orchestrator.turns) in one round trip: one call of the script,
        which fences and answers each commit on its own → per commit its result. The commits'
        arguments (about 20 each) travel packed in one string: redis-py packs each argument of a
        command in Python, msgpack all of them at once in C. A Redis that forgot the script (a
        restart) gets it again from the registered script's call."""
        keys = [key for session_keys, _ in commits for key in session_keys]
        packed = msgpack.packb([args for _, args in commits], use_bin_type=False)  # strings: as old Redis reads them
        return await self._retrying(lambda: self._commit(keys=keys, args=[self.ttl_s, packed]))

    async def amend_redis_ms(self, session_id: str, cycle: int, redis_ms: float) -> bool:
        """Write a committed cycle's Redis time into its stored stats (the last cycle's: no commit
        follows to carry it) → whether Redis took it. One attempt, and no error: the tokens are
        committed, only a statistic would be missing."""
        try:
            await self._amend(keys=_keys(session_id)[2:], args=list(_amendment(cycle, redis_ms)))
            return True
        except RedisError as e:
            log.warning("the Redis time of cycle %d of %s was not stored: %s", cycle, session_id, e)
            return False

    async def claim(self, session_id: str, owner: str) -> SessionRecord | None:
        """Take an unfinished session over for `owner` and return it (None: no such session)."""
        found = await self._retrying(lambda: self._claim(keys=_keys(session_id), args=[owner]))
        if found is None:
            return None
        pairs, packed_tokens, packed_cycles = found
        return _record(session_id, dict(zip(pairs[::2], pairs[1::2])), packed_tokens, packed_cycles)

    async def finish(self, session_id: str, owner: str, status: str) -> bool:
        """Record how a session ended (abandoned, unavailable), if `owner` still writes it."""
        return bool(await self._retrying(lambda: self._finish(keys=_keys(session_id)[:1], args=[owner, status])))

    async def stop(self, session_id: str, status: str = "abandoned") -> bool:
        """Stop an unfinished session, whoever writes it; False if it is finished or stopped."""
        return bool(await self._retrying(lambda: self._stop(keys=_keys(session_id)[:1], args=[status])))

    async def load(self, session_id: str) -> SessionRecord | None:
        meta_key, tokens_key, cycles_key = _keys(session_id)

        async def read():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(meta_key)
                pipe.get(tokens_key)
                pipe.get(cycles_key)
                return await pipe.execute()

        meta, packed_tokens, packed_cycles = await self._retrying(read)
        if not meta or packed_tokens is None:
            return None
        return _record(session_id, meta, packed_tokens, packed_cycles or b"")

    async def close(self) -> None:
        await self.redis.aclose()


async def read_session(redis_url: str, session_id: str) -> SessionRecord | None:
    """One session's record, over a connection of its own (for tools, benchmarks and tests)."""
    store = SessionStore.from_url(redis_url)
    try:
        return await store.load(session_id)
    finally:
        await store.close()
