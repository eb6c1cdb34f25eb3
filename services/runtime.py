"""The model runtime: one Hugging Face causal LM and a KV cache per session.

Caches are soft state (Redis holds the truth): every call says how many committed tokens the
caller believes the cache holds (`cache_len`); the runtime crops to it and extends, or reports
a miss when it holds fewer. Least-recently-used sessions are evicted under a memory bound.

The forward pass is `tandem.services.llama.LlamaPass` for the Llama architecture (the same
function in fewer operator calls), and Hugging Face's own for every other model.
"""

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from tandem.services.llama import Feed, LlamaPass, to_column_major, unsupported
from tandem.wire.worker import ModelInfo

log = logging.getLogger("tandem.worker")


@dataclass
class _Session:
    cache: Any  # the forward pass's: a DynamicCache or a llama.KVBuffer
    length: int  # tokens held
    nbytes: int = 0


class CacheMiss(Exception):
    """The runtime holds fewer tokens of the session than the caller believes."""


@dataclass(frozen=True)
class Step:
    """What a job asks of the model: run `tokens` after the session's first cache_len tokens and
    give back the logits of the last `keep` (0: all). With `parents`, the tokens are a token
    tree's nodes (llama.Feed)."""

    session_id: str
    cache_len: int
    tokens: list[int]
    keep: int = 0
    parents: tuple[int, ...] | None = None


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


class HFPass:
    """Any causal LM through Hugging Face's forward pass, with a DynamicCache per session."""

    name = "hf"
    batched = False  # forward_batch runs its feeds one after another

    def __init__(self, model: torch.nn.Module, column_major: bool) -> None:
        self.model = model
        if column_major:
            gemm_friendly_layout(model)

    def new_cache(self, length: int) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def forward(self, cache: DynamicCache, start: int, tokens: list[int], keep: int) -> torch.Tensor:
        return self._run(Feed(cache, start, tokens, keep))

    def forward_batch(self, feeds: list[Feed]) -> list[torch.Tensor]:
        """Each feed through its own forward: Hugging Face's caches of different lengths do not
        share a pass without padding every one of them."""
        return [self._run(f) for f in feeds]

    def _run(self, feed: Feed) -> torch.Tensor:
        """→ logits [keep, V]. A tree's feed passes its mask (4-D, additive) and positions."""
        held = feed.cache.get_seq_length()
        if held > feed.start:
            feed.cache.crop(feed.start - held)  # negative: tokens to remove
        device = self.model.device
        input_ids = torch.tensor([feed.tokens], dtype=torch.long, device=device)  # [1, n]
        tree = {}
        if feed.parents is not None:
            dtype = self.model.dtype
            allowed = feed.visible(device)  # [n, start+n]
            bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
            tree = {"attention_mask": bias[None, None], "position_ids": torch.tensor([feed.positions()], device=device)}
        # logits_to_keep: a prefill needs no vocabulary projection of the prompt.
        out = self.model(input_ids=input_ids, past_key_values=feed.cache, use_cache=True, logits_to_keep=feed.keep,
                         **tree)
        return out.logits[0]  # [keep, V]

    @staticmethod
    def keep_path(cache: DynamicCache, start: int, nodes: list[int]) -> None:
        """llama.KVBuffer.keep_path for a DynamicCache: the path's keys and values to start.., the rest cropped."""
        index = [start + i for i in nodes]
        for layer in cache.layers:
            for t in (layer.keys, layer.values):  # [batch, kv_heads, length, head_dim]
                t[:, :, start:start + len(nodes)] = t[:, :, index]
        cache.crop(start + len(nodes) - cache.get_seq_length())

    @staticmethod
    def cache_nbytes(cache: DynamicCache) -> int:
        total = 0
        for layer in cache.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.nelement() * t.element_size()
        return total


class ModelRuntime:
    """A loaded model plus per-session KV caches. Not thread-safe: call from one thread."""

    def __init__(
        self,
        model_dir: str,
        device: str = "cpu",
        dtype: str = "float32",
        max_cache_bytes: int = 2 << 30,
    ) -> None:
        self.device = torch.device(device)
        torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
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
        self.forward_pass = HFPass(model, cpu) if reason else LlamaPass(model, cpu)
        if reason:
            log.info("Hugging Face's forward pass for %s: %s", model_dir, reason)
        self.max_cache_bytes = max_cache_bytes
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        # Guards the session table against Release from the loop and scrapes from the metrics
        # thread; re-entrant because eviction reads cache_bytes while holding it.
        self._lock = threading.RLock()

    @property
    def cache_bytes(self) -> int:
        with self._lock:  # metrics read it from their own thread
            return sum(s.nbytes for s in self._sessions.values())

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def held(self, session_id: str) -> int:
        """Tokens of the session the cache holds (0: none)."""
        with self._lock:
            session = self._sessions.get(session_id)
            return session.length if session else 0

    def extend(self, session_id: str, cache_len: int, tokens: list[int], keep: int = 0) -> torch.Tensor:
        """Crop the session's cache to cache_len, run tokens through it → logits [n, V] for the
        last n = keep tokens (all of them when keep is 0).

        Raises CacheMiss when the runtime holds fewer than cache_len tokens of the session.
        """
        result = self.extend_batch([Step(session_id, cache_len, tokens, keep)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def extend_batch(self, steps: list["Step"]) -> list[torch.Tensor | CacheMiss]:
        """extend() for several sessions (one step each) in one forward pass → per step, its
        logits or the CacheMiss it got; a miss leaves the other steps alone. An error of the
        pass itself is raised."""
        results: list = [None] * len(steps)
        runnable = []  # (index, step, session)
        for i, step in enumerate(steps):
            try:
                runnable.append((i, step, self._checkout(step.session_id, step.cache_len, len(step.tokens))))
            except CacheMiss as e:
                results[i] = e
        if not runnable:
            return results
        feeds = [Feed(session.cache, step.cache_len, step.tokens, step.keep or len(step.tokens), step.parents)
                 for _, step, session in runnable]
        try:
            with torch.inference_mode():
                logits = self.forward_pass.forward_batch(feeds)
        except BaseException:
            # A failed pass may have extended some layers and not others: forget its sessions,
            # so that the callers' retries are clean CacheMisses and re-prefill.
            for _, step, _ in runnable:
                self.release(step.session_id)
            raise
        for (i, step, session), out in zip(runnable, logits):
            session.length = step.cache_len + len(step.tokens)
            session.nbytes = self.forward_pass.cache_nbytes(session.cache)
            results[i] = out
        self._evict(keep={step.session_id for step in steps})
        return results

    def keep_path(self, keep: KeepPath) -> bool:
        """Apply a KeepPath → whether the session was held."""
        with self._lock:
            session = self._sessions.get(keep.session_id)
            if session is None:
                return False
            with torch.inference_mode():
                self.forward_pass.keep_path(session.cache, keep.start, keep.nodes)
            session.length = keep.start + len(keep.nodes)
            return True

    def release(self, session_id: str) -> bool:
        with self._lock:
            return self._sessions.pop(session_id, None) is not None

    def _checkout(self, session_id: str, cache_len: int, new_tokens: int) -> _Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.length < cache_len:
                if cache_len > 0:
                    raise CacheMiss(session_id)
                session = _Session(self.forward_pass.new_cache(new_tokens), 0)
                self._sessions[session_id] = session
            self._sessions.move_to_end(session_id)
            return session

    def _evict(self, keep: set[str]) -> None:
        """Drop least-recently-used sessions while over the memory bound, never those in `keep`
        (the pass that just ran)."""
        with self._lock:
            while self.cache_bytes > self.max_cache_bytes:
                oldest = next(iter(self._sessions))
                if oldest in keep:
                    break
                del self._sessions[oldest]


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
