"""The draft worker: extends a session's cache, then drafts γ tokens autoregressively."""

import torch

from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, uniform
from tandem.math.sampling import sample, warp
from tandem.services import distributions
from tandem.services.batching import DEFAULT_BATCH_TOKENS, Job
from tandem.services.limits import MAX_GAMMA
from tandem.services.runtime import ModelRuntime, Step
from tandem.services.server import LARGE_PROBS, LARGE_TOKENS, WorkerServicer
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.validation import check_context, invalid


def propose(
    session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
    step: type[Step] = Step,
) -> Job:
    """The job (tandem.services.batching) that drafts gamma tokens after the committed
    sequence, one step per drafted token → a Proposal. Raises CacheMiss. step: the kind of Step
    it yields (the hybrid drafter marks those its model runs).

    The cache ends holding the committed tokens and the first γ−1 drafted ones (the last
    drafted token is never fed: the verifier may reject it).
    """
    position = cache_len + len(tokens)  # absolute position of the first drafted token
    logits = (yield step(session_id, cache_len, tokens, keep=1))[0]  # [V]
    drafted, token_probs, dists = [], [], []
    for i in range(gamma):
        if params.greedy:  # warp's one-hot and its draw, without vocabulary-sized work
            token, prob = int(logits.argmax()), 1.0
        else:
            probs = warp(logits, params)  # [V]
            token = int(sample(probs, torch.tensor(uniform(params.seed, position + i, Purpose.DRAFT))))
            prob = float(probs[token])
            dists.append(probs)
        drafted.append(token)
        token_probs.append(prob)
        if i + 1 < gamma:
            logits = (yield step(session_id, position + i, [token], keep=1))[0]
    # Greedy drafts are one-hot: the verifier rebuilds them from the token ids alone.
    packed = [] if params.greedy else distributions.pack(torch.stack(dists))
    return wire.Proposal(drafted, token_probs, packed, 0.0)


class DraftWorkerServicer(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    service = "tandem.v1.DraftWorker"

    async def Propose(self, request, context):
        async def work():
            self.check_sequence(request.session_id, request.cache_len, request.tokens)
            if not 1 <= request.gamma <= MAX_GAMMA:
                raise invalid("gamma", f"must be in [1, {MAX_GAMMA}], got {request.gamma}")
            end = request.cache_len + len(request.tokens) + request.gamma - 1
            check_context("gamma", end, self.runtime.info.max_context)
            params = self.check_sampling(request.sampling)
            job, probs = self.draft(request, params)
            return await self.compute(job, large=len(request.tokens) >= LARGE_TOKENS or probs >= LARGE_PROBS)

        return await self.answer(context, "Propose", request, work, wire.propose_response)

    def draft(self, request, params: SamplingParams) -> tuple[Job, int]:
        """The job that answers a checked request, and how many probabilities it returns."""
        probs = 0 if params.greedy else request.gamma * self.runtime.info.vocab_size
        return propose(request.session_id, request.cache_len, list(request.tokens), request.gamma, params), probs

    async def ProposeStream(self, requests, context):
        async for request in requests:
            response = await self.Propose(request, context)
            if response is None:  # refused: the status set on the context ends the stream
                return
            yield response


def add_to_server(runtime: ModelRuntime, server, max_batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
    worker_pb2_grpc.add_DraftWorkerServicer_to_server(DraftWorkerServicer(runtime, max_batch_tokens), server)
