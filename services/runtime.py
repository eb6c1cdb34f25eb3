"""The model runtime: one Hugging Face causal LM and a KV cache per session.

Caches are soft state (Redis holds the truth): every call says how many committed tokens the
caller believes the cache holds (`cache_len`); the runtime crops to it and extends, or reports
a miss when it holds fewer. Before a pass, each of its sessions reserves room for its new tokens
under the memory bound, evicting least-recently-used sessions outside the pass when it must; a
session that still finds no room is refused (RESOURCE_EXHAUSTED), the rest of the pass runs.

The forward pass is `tandem.services.llama.LlamaPass` for the Llama architecture (every
session's keys and values in one paged pool, one attention call per layer for a whole batch),
and Hugging Face's own for every other model: a DynamicCache per session and a forward call per
session, one after another (correct, not batched).
"""

import inspect
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from tandem.services.llama import Feed, LlamaPass, to_column_major, unsupported
from tandem.wire.validation import FieldError
from tandem.wire.worker import ModelInfo

log = logging.getLogger("tandem.worker")


@dataclass(frozen=True)
class KeptBlock:
    """The draft distributions of a block a verifier drafted for a session's next cycle and kept
    with the session's cache rather than answering them (VerifyRequest.keep_next_distributions):
    the position of its first token, its tokens and parents (a chain's empty), and one packed
    distribution per row (tandem.services.distributions)."""

    position: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    distributions: tuple

    @property
    def nbytes(self) -> int:
        return sum(len(d.probs) + len(d.token_ids) for d in self.distributions)

    def holds(self, tokens, parents) -> bool:
        """Whether a block of these tokens and parents is a prefix of this one, a chain of a
        chain's, a tree of a tree's (the caller may verify fewer tokens than were drafted)."""
        return (tuple(tokens) == self.tokens[:len(tokens)] and bool(parents) == bool(self.parents)
                and tuple(parents) == self.parents[:len(parents)])


@dataclass
class _Session:
    cache: Any  # the forward pass's: a kv.BlockTable or a DynamicCache
    length: int  # tokens held
    kept: KeptBlock | None = None  # its next block's distributions, where this verifier drafted it


class CacheMiss(Exception):
    """The runtime holds fewer tokens of the session than the caller believes."""


class CacheFull(FieldError):
    """The KV cache cannot hold a step's session beside the other sessions of its pass."""

    def __init__(self, session_id: str, tokens: int, max_bytes: int) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, "tokens",
                         f"the worker's KV cache ({max_bytes >> 20} MiB, --max-cache-mb) cannot hold {tokens} tokens "
                         f"of session {session_id!r} beside the other sessions of its pass")


@dataclass(frozen=True)
class Step:
    """What a job asks of the model: run `tokens` after the session's first cache_len tokens and
    give back the logits of the last `keep` (0: all), or, with `ask`, what the ask computes from
    them (tandem.services.sampler: drawing, verifying), for the whole round at once. With
    `parents`, the tokens are a token tree's nodes (llama.Feed)."""

    session_id: str
    cache_len: int
    tokens: list[int]
    keep: int = 0
    parents: tuple[int, ...] | None = None
    ask: Any = None


@dataclass(frozen=True)
class KeepPath:
    """What a job asks of the session's cache after a tree's step: keep the nodes (tree indices,
    a root-to-node path) whose keys and values sit at start, start+1, … and end the cache there.
    A job yields it like a Step and is sent whether the session was still held."""

    session_id: str
    start: int
    nodes: list[int]


def eos_token_ids(config) -> tuple[int, ...]:
    """A config's (or generation config's) EOS ids as a tuple; HF allows an int or a list."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def cache_argument(model: torch.nn.Module) -> str:
    """The name the model's forward pass takes its KV cache by: `cache` in recent Transformers,
    which drop the old `past_key_values` in 5.40; `past_key_values` in those before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFPass:
    """Any causal LM through Hugging Face's forward pass, with a DynamicCache per session."""

    name = "hf"
    batched = False  # forward_batch runs its feeds one after another

    def __init__(self, model: torch.nn.Module, column_major: bool, max_cache_bytes: int = 2 << 30) -> None:
        self.model = model
        self.cache_argument = cache_argument(model)
        if column_major:
            gemm_friendly_layout(model)
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        # A standard cache's bytes per token; the bound is kept with it, the accounting with the real sizes.
        self.token_bytes = c.num_hidden_layers * 2 * kv_heads * head_dim * model.dtype.itemsize
        self.max_cache_bytes = max_cache_bytes
        self.cache_bytes = 0
        self._nbytes: dict[int, int] = {}  # id(cache) → its bytes, in cache_bytes

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def reserve(self, cache: DynamicCache, tokens: int) -> bool:
        return self.cache_bytes + max(0, tokens - cache.get_seq_length()) * self.token_bytes <= self.max_cache_bytes

    def crop(self, cache: DynamicCache, tokens: int) -> None:
        held = cache.get_seq_length()
        if held > tokens:
            cache.crop(tokens - held)  # negative: tokens to remove
            self._count(cache)

    def release(self, cache: DynamicCache) -> None:
        self.cache_bytes -= self._nbytes.pop(id(cache), 0)

    def forward(self, cache: DynamicCache, start: int, tokens: list[int], keep: int) -> torch.Tensor:
        return self.forward_batch([Feed(cache, start, tokens, keep)])[0]

    def forward_batch(self, feeds: list[Feed]) -> list[torch.Tensor]:
        """Each feed through its own forward: Hugging Face's caches of different lengths do not
        share a pass without padding every one of them."""
        out = [self._run(f) for f in feeds]
        for f in feeds:
            self._count(f.cache)
        return out

    def _run(self, feed: Feed) -> torch.Tensor:
        """→ logits [keep, V]. A tree's feed passes its mask (4-D, additive) and positions."""
        self.crop(feed.cache, feed.start)
        device = self.model.device
        input_ids = torch.tensor([feed.tokens], dtype=torch.long, device=device)  # [1, n]
        tree = {}
        if feed.parents is not None:
            dtype = self.model.dtype
            allowed = feed.visible(device)  # [n, start+n]
            bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
            tree = {"attention_mask": bias[None, None], "position_ids": torch.tensor([feed.positions()], device=device)}
        # logits_to_keep: a prefill needs no vocabulary projection of the prompt.
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=feed.keep,
                         **{self.cache_argument: feed.cache}, **tree)
        return out.logits[0]  # [keep, V]

    def keep_paths(self, paths: list[tuple[DynamicCache, int, list[int]]]) -> None:
        """LlamaPass.keep_paths for DynamicCaches: each path's keys and values to start.., the rest cropped."""
        for cache, start, nodes in paths:
            index = [start + i for i in nodes]
            for layer in cache.layers:
                for t in (layer.keys, layer.values):  # [batch, kv_heads, length, head_dim]
                    t[:, :, start:start + len(nodes)] = t[:, :, index]
            self.crop(cache, start + len(nodes))

    def _count(self, cache: DynamicCache) -> None:
        total = 0
        for layer in cache.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.nelement() * t.element_size()
        self.cache_bytes += total - self._nbytes.get(id(cache), 0)
        self._nbytes[id(cache)] = total


class ModelRuntime:
    """A loaded model plus per-session KV caches. Not thread-safe: call from one thread."""

    draft_step: type[Step] | None = None  # a runtime that drafts inside the verifier: its drafting step

    def __init__(
        self,
        model_dir: str,
        device: str = "cpu",
        dtype: str = "float32",
        max_cache_bytes: int = 2 << 30,
        model: torch.nn.Module | None = None,
    ) -> None:
        """model: one already built (benchmarks/gpu_costs.py's random weights, too large to save
        and load), served as model_dir's; None reads it from model_dir."""
        self.device = torch.device(device)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        model.to(self.device).eval()
        config = model.config
        self.info = ModelInfo(
            model=model_dir,
            vocab_size=int(model.get_output_embeddings().weight.shape[0]),
            max_context=int(getattr(config, "max_position_embeddings", 2048)),
            eos_token_ids=eos_token_ids(model.generation_config) or eos_token_ids(config),
            device=str(self.device),
            dtype=dtype,
            num_parameters=sum(p.numel() for p in model.parameters()),
        )
        # After counting: a pass may copy weights (a tied output embedding gets its own).
        cpu = self.device.type == "cpu"
        reason = unsupported(model)
        self.forward_pass = (HFPass if reason else LlamaPass)(model, cpu, max_cache_bytes)
        if reason:
            log.info("Hugging Face's forward pass for %s: %s", model_dir, reason)
        self.max_cache_bytes = max_cache_bytes
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        # Guards the session table against Release from the loop and scrapes from the metrics
        # thread.
        self._lock = threading.RLock()

    @property
    def cache_bytes(self) -> int:
        with self._lock:
            kept = sum(s.kept.nbytes for s in self._sessions.values() if s.kept is not None)
        return self.forward_pass.cache_bytes + kept

    @property
    def token_bytes(self) -> int:
        """KV-cache bytes per token of a session."""
        return self.forward_pass.token_bytes

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def held(self, session_id: str) -> int:
        """Tokens of the session the cache holds (0: none)."""
        with self._lock:
            session = self._sessions.get(session_id)
            return session.length if session else 0

    def keep_block(self, session_id: str, block: KeptBlock) -> bool:
        """Keep a block's distributions with the session's cache (they go when it goes) → False
        when the cache no longer holds the session."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                session.kept = block
            return session is not None

    def kept_block(self, session_id: str, position: int) -> KeptBlock | None:
        """The session's kept block where its first token sits at `position`: a verify there
        uses it (and a retry of that verify: calls stay idempotent). A verify elsewhere has moved
        past it, and it goes."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.kept is None:
                return None
            if session.kept.position != position:
                session.kept = None
            return session.kept

    def extend(self, session_id: str, cache_len: int, tokens: list[int], keep: int = 0) -> torch.Tensor:
        """Crop the session's cache to cache_len, run tokens through it → logits [n, V] for the
        last n = keep tokens (all of them when keep is 0).

        Raises CacheMiss when the runtime holds fewer than cache_len tokens of the session, and
        CacheFull when the memory bound leaves no room for it.
        """
        result = self.extend_batch([Step(session_id, cache_len, tokens, keep)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def extend_batch(self, steps: list["Step"]) -> list[torch.Tensor | CacheMiss | CacheFull]:
        """extend() for several sessions (one step each) in one forward pass → per step, its
        logits or the CacheMiss or CacheFull it got; those leave the other steps alone. An error
        of the pass itself is raised."""
        results: list = [None] * len(steps)
        runnable = []  # (index, step, session)
        in_pass = {step.session_id for step in steps}
        for i, step in enumerate(steps):
            try:
                session = self._checkout(step.session_id, step.cache_len)
            except CacheMiss as e:
                results[i] = e
                continue
            end = step.cache_len + len(step.tokens)
            if self._reserve(session, end, in_pass):
                runnable.append((i, step, session))
            else:
                results[i] = CacheFull(step.session_id, end, self.max_cache_bytes)
                self.release(step.session_id)
        if not runnable:
            return results
        feeds = [Feed(session.cache, step.cache_len, step.tokens, step.keep or len(step.tokens), step.parents)
                 for _, step, session in runnable]
        try:
            with torch.inference_mode():
                logits = self.forward(feeds, [step for _, step, _ in runnable])
        except BaseException:
            # A failed pass may have extended some layers and not others: forget its sessions,
            # so that the callers' retries are clean CacheMisses and re-prefill.
            for _, step, _ in runnable:
                self.release(step.session_id)
            raise
        for (i, step, session), out in zip(runnable, logits):
            session.length = step.cache_len + len(step.tokens)
            results[i] = out
        return results

    def forward(self, feeds: list[Feed], steps: list[Step]) -> list[torch.Tensor]:
        """The pass of extend_batch's runnable steps → each one's logits (a subclass that reads
        more of the pass, the hidden states a head drafts from, overrides it)."""
        return self.forward_pass.forward_batch(feeds)

    def keep_paths(self, keeps: list[KeepPath]) -> list[bool]:
        """Apply KeepPaths, all in one go → per keep, whether its session was held."""
        with self._lock:
            held = [(keep, self._sessions.get(keep.session_id)) for keep in keeps]
            paths = [(session.cache, keep.start, keep.nodes) for keep, session in held if session is not None]
            with torch.inference_mode():
                self.forward_pass.keep_paths(paths)
            for keep, session in held:
                if session is not None:
                    session.length = keep.start + len(keep.nodes)
            return [session is not None for _, session in held]

    def release(self, session_id: str) -> bool:
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                self.forward_pass.release(session.cache)
            return session is not None

    def _checkout(self, session_id: str, cache_len: int) -> _Session:
        """The session cropped to cache_len (a new one at 0), most recently used. Raises CacheMiss."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.length < cache_len:
                if cache_len > 0:
                    raise CacheMiss(session_id)
                if session is not None:
                    self.forward_pass.release(session.cache)
                session = self._sessions[session_id] = _Session(self.forward_pass.new_cache(), 0)
            elif session.length > cache_len:
                self.forward_pass.crop(session.cache, cache_len)
                session.length = cache_len
            self._sessions.move_to_end(session_id)
            return session

    def _reserve(self, session: _Session, tokens: int, in_pass: set[str]) -> bool:
        """Room for the session's first `tokens` tokens, evicting least-recently-used sessions
        outside the pass while there is none → False when even that leaves none."""
        with self._lock:
            return make_room(lambda: self.forward_pass.reserve(session.cache, tokens), self._sessions, in_pass,
                             self.release)


def make_room(has_room, sessions, in_pass: set[str], release) -> bool:
    """Release the first of `sessions` (in their order) outside the pass until has_room() → False
    when none is left to release."""
    while not has_room():
        oldest = next((sid for sid in sessions if sid not in in_pass), None)
        if oldest is None:
            return False
        release(oldest)
    return True


def gemm_friendly_layout(model: torch.nn.Module) -> None:
    """Store every Linear weight [out, in] column-major, in place; the values do not change.

    F.linear multiplies by weight.T, which is then a row-major [in, out] matrix, the operand
    layout MKL's sgemm runs fastest with when the input has a few rows (a decode step, a
    verify block) on the CPUs measured. On the shipped target, one thread of a 2-core
    EPYC, a forward pass of 1–5 tokens takes 3–10 % less time (benchmarks/forward_pass.py).
    A weight tied to the input embeddings gets its own copy, so that embedding lookups keep
    reading contiguous rows.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(to_column_major(module.weight), requires_grad=False)


def timed(fn, *args, **kwargs):
    """Run fn and return (result, milliseconds)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, (time.perf_counter() - start) * 1e3
