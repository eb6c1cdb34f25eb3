"""One generation of one mode, timed token by token: Hugging Face in this process, or the
cluster through the SDK. Both count time the same way: from the call to each token's arrival
at the caller."""

import asyncio
import time
from dataclasses import asdict, dataclass, field

import torch

from tandem import AsyncClient, Client

HF_MODES = ("hf_target", "hf_assisted", "hf_lookup")
# Hugging Face's prompt lookup (the n-gram peer): drafts of up to this many tokens, its
# documented example's, matching suffixes of up to 2 tokens (its default).
HF_LOOKUP_TOKENS = 10


BLOCK = "_block"  # a cluster mode's suffix: its requests ask for block verification
SHAPES = ("_tree", "_auto")  # the last suffix of a mode whose requests ask for that draft shape (else a chain)


def cluster_mode(gamma: int | None, verification: str = "token", shape: str = "chain") -> str:
    mode = "adaptive" if gamma is None else f"gamma_{gamma}"
    mode += BLOCK if verification == "block" else ""
    return mode if shape == "chain" else f"{mode}_{shape}"


def mode_shape(mode: str) -> str:
    """The request's draft shape for a cluster mode."""
    return next((s[1:] for s in SHAPES if mode.endswith(s)), "chain")


def mode_gamma(mode: str) -> int | None:
    """The request's gamma for a cluster mode (None: adaptive)."""
    mode = mode.removesuffix(f"_{mode_shape(mode)}").removesuffix(BLOCK)
    return None if mode == "adaptive" else int(mode.removeprefix("gamma_"))


def mode_verification(mode: str) -> str:
    return "block" if mode.removesuffix(f"_{mode_shape(mode)}").endswith(BLOCK) else "token"


def ahead_setting(setting: str) -> tuple[int, int] | None:
    """A drafting-ahead setting: "off" → None; "G" (G guesses of the bonus token) or "G+R" (and
    past a rejection at each of a block's first R positions) → (G, R)."""
    if setting == "off":
        return None
    guesses, _, rejections = setting.partition("+")
    return int(guesses), int(rejections or 0)


@dataclass
class Run:
    """One timed generation."""

    mode: str  # one of HF_MODES, or "gamma_<n>" or "adaptive", with "_block" or not, then "_tree", "_auto" or not
    workload: str  # "greedy" or "sampled"
    prompt: int  # index into the prompt list
    token_ids: list[int]
    wall_s: float  # call to last token
    arrivals_s: list[float]  # per delivery (a cycle's tokens arrive together): time since the call
    sizes: list[int]  # tokens per delivery
    stats: dict | None = field(default=None)  # the cluster's GenerationStats (per_cycle included)

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def ttft_s(self) -> float:
        return self.arrivals_s[0] if self.arrivals_s else self.wall_s

    @property
    def gaps_s(self) -> list[float]:
        """Inter-token latency of every token after the first: the wait since the previous
        token, 0 for tokens that arrive in the same delivery (speculation makes it bursty)."""
        gaps, previous = [], None
        for t, n in zip(self.arrivals_s, self.sizes):
            if previous is not None:
                gaps.append(t - previous)
            gaps.extend([0.0] * (n - 1))
            previous = t
        return gaps

    def as_dict(self) -> dict:
        return asdict(self)


class _Timeline:
    """Timestamps each delivery of new tokens since the call began."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.token_ids: list[int] = []
        self.arrivals: list[float] = []
        self.sizes: list[int] = []
        self.stats: dict | None = None

    def add(self, token_ids: list[int]) -> None:
        if token_ids:
            self.arrivals.append(time.perf_counter() - self.start)
            self.sizes.append(len(token_ids))
            self.token_ids.extend(token_ids)

    def add_chunk(self, chunk) -> None:
        self.add(chunk.token_ids)
        if chunk.stats:
            self.stats = asdict(chunk.stats)

    def run(self, mode: str, workload: str, index: int) -> Run:
        wall = time.perf_counter() - self.start
        return Run(mode, workload, index, self.token_ids, wall, self.arrivals, self.sizes, self.stats)


class _Streamer(_Timeline):
    """The Hugging Face streamer side of a timeline (generate() streams the prompt first)."""

    def __init__(self) -> None:
        super().__init__()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.add(value.reshape(-1).tolist())
        self._prompt_seen = True

    def end(self) -> None:
        pass


class HFRunner:
    """Hugging Face `generate`, target alone, assisted by the draft, or by prompt lookup, in this
    process."""

    def __init__(self, target_dir: str, draft_dir: str, threads: int) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.generation.streamers import BaseStreamer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # generate()'s advice would tear the progress bars
        hf_logging.disable_progress_bar()

        self.streamer_class = type("TimelineStreamer", (_Streamer, BaseStreamer), {})
        self.target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
        self.threads = threads

    def run(self, mode: str, workload: str, index: int, prompt: list[int], max_tokens: int, seed: int) -> Run:
        kwargs = {"hf_target": {}, "hf_assisted": {"assistant_model": self.draft},
                  "hf_lookup": {"prompt_lookup_num_tokens": HF_LOOKUP_TOKENS}}[mode]
        if workload == "sampled":  # T=1 over the whole vocabulary, as the cluster's sampled workload
            kwargs |= {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            torch.manual_seed(seed)
        else:
            kwargs |= {"do_sample": False}
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            input_ids = torch.tensor([prompt])  # [1, n]
            with torch.inference_mode():
                streamer = self.streamer_class()
                self.target.generate(input_ids, max_new_tokens=max_tokens, streamer=streamer, **kwargs)
        finally:
            torch.set_num_threads(threads)
        return streamer.run(mode, workload, index)


class _StepClock:
    """A generate() streamer that timestamps each decoding step of a batch (the first put is the
    prompt)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.steps.append(time.perf_counter() - self.start)
        self._prompt_seen = True

    def end(self) -> None:
        pass


def hf_waves(hf: HFRunner, prompts: list[list[int]], max_tokens: int, batch: int) -> tuple[list[Run], float]:
    """Greedy generate() with the target alone on `batch` prompts at a time, left-padded: what a
    Hugging Face user runs for many requests. A wave ends with its longest generation, and its
    sessions' tokens arrive together, step by step → (runs, wall seconds)."""
    from transformers.generation.streamers import BaseStreamer

    clock_class = type("StepClock", (_StepClock, BaseStreamer), {})
    eos = hf.target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad = min(eos_ids) if eos_ids else 0
    threads = torch.get_num_threads()
    torch.set_num_threads(hf.threads)
    runs, start = [], time.perf_counter()
    try:
        for first in range(0, len(prompts), batch):
            wave = prompts[first:first + batch]
            width = max(map(len, wave))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in wave])  # [B, width]
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in wave])  # [B, width]
            clock = clock_class()
            with torch.inference_mode():
                out = hf.target.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                                         pad_token_id=pad, streamer=clock)
            for i, row in enumerate(out[:, width:].tolist()):
                ends = [k for k, t in enumerate(row) if t in eos_ids]
                tokens = row[:ends[0] + 1] if ends else row
                arrivals = clock.steps[:len(tokens)]
                runs.append(Run("hf_target", "greedy", first + i, tokens, arrivals[-1] if arrivals else 0.0,
                                arrivals, [1] * len(tokens)))
    finally:
        torch.set_num_threads(threads)
    return runs, time.perf_counter() - start


def _request(mode: str, workload: str, prompt: list[int], max_tokens: int, seed: int,
             ignore_eos: bool = False) -> dict:
    temperature = 0.0 if workload == "greedy" else 1.0
    return {"prompt_token_ids": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "gamma": mode_gamma(mode), "verification": mode_verification(mode), "draft_shape": mode_shape(mode),
            "ignore_eos": ignore_eos}


def cluster_run(client: Client, mode: str, workload: str, index: int, prompt: list[int], max_tokens: int,
                seed: int) -> Run:
    """One streamed generation through the cluster's gRPC ingress."""
    timeline = _Timeline()
    for chunk in client.stream(**_request(mode, workload, prompt, max_tokens, seed)):
        timeline.add_chunk(chunk)
    return timeline.run(mode, workload, index)


def concurrent_runs(address: str, mode: str, workload: str, prompts: list[list[int]], max_tokens: int,
                    in_flight: int, seed: int, ignore_eos: bool = False) -> tuple[list[Run], float]:
    """All prompts through the cluster with `in_flight` sessions at a time → (runs, wall seconds);
    ignore_eos: every generation runs to max_tokens (a load of fixed length)."""

    async def one(client, gate, i, prompt):
        async with gate:
            timeline = _Timeline()
            async for chunk in client.stream(**_request(mode, workload, prompt, max_tokens, seed + i, ignore_eos)):
                timeline.add_chunk(chunk)
            return timeline.run(mode, workload, i)

    async def main():
        gate = asyncio.Semaphore(in_flight)
        async with AsyncClient(address) as client:
            start = time.perf_counter()
            runs = await asyncio.gather(*(one(client, gate, i, p) for i, p in enumerate(prompts)))
            return list(runs), time.perf_counter() - start

    return asyncio.run(main())
