"""The draft worker: extends a session's cache, then drafts γ tokens autoregressively."""

import torch

from tandem.math import tree
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, node_uniforms, uniform
from tandem.math.sampling import sample, warp
from tandem.math.tree_sampling import draw_without_replacement
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


def propose_tree(
    session_id: str, cache_len: int, tokens: list[int], widths: list[int], params: SamplingParams,
    step: type[Step] = Step,
) -> Job:
    """The job that drafts a token tree after the committed sequence → a Proposal with parents
    (tandem.math.tree): every node at depth d gets widths[d−1] children, its draft's top tokens
    (greedy) or as many drawn from its draft distribution without replacement (sampled: what the
    verifier's recursive rejection sampling assumes). One step per depth runs that depth's nodes
    after the earlier ones in the cache, under the tree mask (one pass, however wide), so that a
    node's logits see exactly its path. Raises CacheMiss.

    The cache ends holding the committed tokens and the tree's nodes but the last depth's; the
    next call's cache_len keeps the committed ones (the verifier knows the path, the next call
    feeds it).
    """
    position = cache_len + len(tokens)  # absolute position of the depth-1 nodes
    u = [] if params.greedy else node_uniforms(params.seed, position, tree.size(widths), Purpose.TREE_DRAFT)
    logits = yield step(session_id, cache_len, tokens, keep=1)  # [1, V]: the root's
    frontier = [-1]  # the nodes whose children the next depth draws, one row of logits each
    drafted, parents, token_probs, dists = [], [], [], []
    for depth, width in enumerate(widths):
        if params.greedy:  # each node's top tokens; one-hot drafts need no distributions
            children = logits.topk(min(width, logits.shape[-1]), -1).indices.tolist()  # [F][width]
            probs = [None] * len(frontier)
        else:
            probs = warp(logits, params)  # [F, V]
            dists.extend(probs)
            children = []
            for row in probs:
                draws = torch.tensor(u[len(drafted) + sum(map(len, children)):][:width], dtype=torch.float64)
                children.append(draw_without_replacement(row, draws))  # the draws keyed by the nodes they make
        start = len(drafted)
        for node, kids, row in zip(frontier, children, probs):
            drafted.extend(kids)
            parents.extend([node] * len(kids))
            token_probs.extend([1.0] * len(kids) if row is None else row[kids].tolist())
        frontier = list(range(start, len(drafted)))
        if depth + 1 < len(widths):  # this depth's nodes after the earlier ones, which the cache holds
            logits = yield step(session_id, position + start, drafted[start:], keep=len(frontier),
                                parents=tuple(parents))  # [F, V]
    packed = [] if params.greedy else distributions.pack(torch.stack(dists))
    return wire.Proposal(drafted, token_probs, packed, 0.0, parents=parents)


def is_tree(widths: list[int]) -> bool:
    """Whether widths make a tree with branches (all ones: a chain, drafted as one)."""
    return any(w > 1 for w in widths)


def drafted(request) -> int:
    """The tokens a checked ProposeRequest asks for: gamma, or its tree's nodes."""
    return tree.size(list(request.tree_widths)) if request.tree_widths else request.gamma


def check_tree_widths(widths: list[int], gamma: int) -> None:
    """A request's tree_widths, or INVALID_ARGUMENT naming them."""
    if not widths:
        return
    if len(widths) != gamma:
        raise invalid("tree_widths", f"need one width per depth: {gamma} (gamma), got {len(widths)}")
    if min(widths) < 1:
        raise invalid("tree_widths", f"every width must be at least 1, got {widths}")
    nodes = tree.size(widths)
    if nodes > MAX_GAMMA:
        raise invalid("tree_widths", f"the tree has {nodes} nodes; at most {MAX_GAMMA}")


class DraftWorkerServicer(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    service = "tandem.v1.DraftWorker"

    async def Propose(self, request, context):
        async def work():
            self.check_sequence(request.session_id, request.cache_len, request.tokens)
            if not 1 <= request.gamma <= MAX_GAMMA:
                raise invalid("gamma", f"must be in [1, {MAX_GAMMA}], got {request.gamma}")
            check_tree_widths(list(request.tree_widths), request.gamma)
            end = request.cache_len + len(request.tokens) + drafted(request) - 1
            check_context("gamma", end, self.runtime.info.max_context)
            params = self.check_sampling(request.sampling)
            job, probs = self.draft(request, params)
            return await self.compute(job, large=len(request.tokens) >= LARGE_TOKENS or probs >= LARGE_PROBS)

        return await self.answer(context, "Propose", request, work, wire.propose_response)

    def draft(self, request, params: SamplingParams) -> tuple[Job, int]:
        """The job that answers a checked request, and how many probabilities it returns."""
        widths = list(request.tree_widths)
        args = (request.session_id, request.cache_len, list(request.tokens))
        job = propose_tree(*args, widths, params) if is_tree(widths) else propose(*args, request.gamma, params)
        return job, self.returned_probs(request, params)

    def returned_probs(self, request, params: SamplingParams) -> int:
        """How many probabilities a checked request's answer holds at most: the draft's whole
        distribution per drafted token when sampling, none when greedy."""
        return 0 if params.greedy else drafted(request) * self.runtime.info.vocab_size

    async def ProposeStream(self, requests, context):
        async for request in requests:
            response = await self.Propose(request, context)
            if response is None:  # refused: the status set on the context ends the stream
                return
            yield response


def add_to_server(runtime: ModelRuntime, server, max_batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
    worker_pb2_grpc.add_DraftWorkerServicer_to_server(DraftWorkerServicer(runtime, max_batch_tokens), server)
