"""A worker's pass curve: its forward pass timed at a ladder of token counts when it loads, before
it serves (ModelInfo.pass_ms). The orchestrator's γ policy prices a pass of any size from it
(tandem.math.fit.PassCost): on a CPU a pass's cost per token falls as it grows (the shipped
target: 5.0 ms for one token, 8.2 for four, 10.2 for nine, 16.4 for 32), which a line fitted
over the few token counts a lone session's blocks span cannot know; on a GPU a pass costs about
the same until its tokens fill the device."""

import statistics
import time

import torch

# Token counts timed: a lone session's blocks (γ ≤ 8 and the token after) one by one, then the
# passes of many sessions.
LADDER = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128)
CONTEXT = 64  # the tokens each timed pass attends over: a short prompt's
REPETITIONS = 5  # per count, after one round that is not timed (the first passes allocate)
TOKEN = 1  # what every timed pass runs: a pass costs the same whatever its tokens


def pass_ms(forward_pass, ladder: tuple[int, ...] = LADDER, context: int = CONTEXT,
            repetitions: int = REPETITIONS) -> dict[int, float]:
    """{tokens: the median ms of one session's pass of that many tokens, every row's logits kept,
    on a cache of `context` tokens} for a worker's forward pass (services.llama.LlamaPass or
    services.runtime.HFPass); {} where its cache has no room for the longest."""
    times: dict[int, list[float]] = {n: [] for n in ladder}
    cache = forward_pass.new_cache()
    try:
        if not forward_pass.reserve(cache, context + max(ladder)):
            return {}
        with torch.inference_mode():
            forward_pass.forward(cache, 0, [TOKEN] * context, 1)
            for round_ in range(repetitions + 1):
                for n in ladder:
                    forward_pass.crop(cache, context)
                    start = time.perf_counter()
                    # .item(): the pass has run, on whatever device (a GPU's kernels are asynchronous).
                    forward_pass.forward(cache, context, [TOKEN] * n, n)[-1, 0].item()
                    if round_:
                        times[n].append((time.perf_counter() - start) * 1e3)
    finally:
        forward_pass.release(cache)
    return {n: statistics.median(t) for n, t in times.items()}
