"""The draft worker: extends a session's cache, then drafts γ tokens autoregressively."""

from dataclasses import replace

from tandem.math import tree
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.services.batching import Job
from tandem.services.limits import MAX_GAMMA
from tandem.services.runtime import Step
from tandem.services.sampler import Branch, Draw
from tandem.services.server import LARGE_PROBS, LARGE_TOKENS, Work, WorkerServicer
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.generation import TREE_RULE
from tandem.wire.validation import check_context, invalid


def propose(
    session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
    step: type[Step] = Step, ahead: bool = False,
) -> Job:
    """The job (tandem.services.batching) that drafts gamma tokens after the committed
    sequence, one step per drafted token, each drawn with the round's others
    (tandem.services.sampler.Draw) → a Proposal. Raises CacheMiss. step: the kind of Step it
    yields (the hybrid drafter marks those its model runs). ahead: the first drafted token
    guesses a bonus token, and the block after it is keyed as its own cycle's.

    The cache ends holding the committed tokens and the first γ−1 drafted ones (the last
    drafted token is never fed: the verifier may reject it).
    """
    position = cache_len + len(tokens)  # absolute position of the first drafted token
    u = [] if params.greedy else draw_uniforms(params.seed, position, gamma, ahead)
    drawn = yield step(session_id, cache_len, tokens, keep=1, ask=Draw(params, u[0] if u else 0.0))
    draws = [drawn]
    for i in range(1, gamma):
        drawn = yield step(session_id, position + i - 1, [drawn.token], keep=1,
                           ask=Draw(params, u[i] if u else 0.0))
        draws.append(drawn)
    # Greedy drafts are one-hot: the verifier rebuilds them from the token ids alone.
    packed = [] if params.greedy else [d.distribution for d in draws]
    return wire.Proposal([d.token for d in draws], [d.prob for d in draws], packed, 0.0)


def draw_uniforms(seed: int, position: int, gamma: int, ahead: bool = False) -> list[float]:
    """The uniforms of a chain's γ draws from `position` on, keyed by the cycle they draft for
    (tandem.math.rng): the one starting there, or when drafting ahead, the guess's own, then
    the next cycle's from the position after it."""
    if not ahead:
        return cycle_uniforms(seed, position, gamma, Purpose.DRAFT)
    return cycle_uniforms(seed, position, 1, Purpose.DRAFT) + cycle_uniforms(seed, position + 1, gamma - 1,
                                                                           Purpose.DRAFT)


def propose_ahead(
    session_id: str, cache_len: int, tokens: list[int], gamma: int, guesses: int, params: SamplingParams,
    step: type[Step] = Step,
) -> Job:
    """The job that drafts past a block under verification for several of its outcomes: the
    block accepted whole with each of `guesses` guesses of its bonus token (a node's children by
    the greedy tree rule: the draft's most likely tokens but one, and one drawn from the rest),
    each guess followed by γ − 1 tokens drawn as a call drafting after that guess would draw
    them (tandem.math.rng: one uniform per position, whichever guess it follows) → a token tree
    of widths (guesses, 1, …, 1). Raises CacheMiss.

    One guess is `propose(..., ahead=True)` laid out as a tree; a chain keeps its cache, so the
    draft worker calls that one."""
    position = cache_len + len(tokens)  # absolute position of the guesses
    u = None if params.greedy else draw_uniforms(params.seed, position, gamma, ahead=True)
    return (yield from propose_tree(session_id, cache_len, tokens, [guesses] + [1] * (gamma - 1), params, step,
                                    "greedy", u))


def propose_tree(
    session_id: str, cache_len: int, tokens: list[int], widths: list[int], params: SamplingParams,
    step: type[Step] = Step, rule: str = "rrsw", depth_uniforms: list[float] | None = None,
) -> Job:
    """The job that drafts a token tree after the committed sequence → a Proposal with parents
    (tandem.math.tree): every node at depth d gets widths[d−1] children, its draft's top tokens
    (greedy) or, sampled, as the tree rule draws them (rrsw: as many drawn without replacement,
    what the verifier's recursive rejection sampling assumes; greedy: the top tokens but one and
    one drawn from the rest; tandem.services.sampler.Branch). One step
    per depth runs that depth's nodes after the earlier ones in the cache, under the tree mask
    (one pass, however wide), so that a node's logits see exactly its path. Raises CacheMiss.

    The cache ends holding the committed tokens and the tree's nodes but the last depth's; the
    next call's cache_len keeps the committed ones (the verifier knows the path, the next call
    feeds it). depth_uniforms: sampled, one uniform per depth that all of its draws use (a chain
    under each node, keyed by position: drafting ahead) in place of the tree's own, one per node.
    """
    position = cache_len + len(tokens)  # absolute position of the depth-1 nodes
    own = depth_uniforms is None and not params.greedy
    u = tuple(cycle_uniforms(params.seed, position, tree.size(widths), Purpose.TREE_DRAFT)) if own else ()
    feed = step(session_id, cache_len, tokens, keep=1)  # the root's row
    drafted, parents, token_probs, dists = [], [], [], []
    frontier = [-1]  # the nodes whose children this depth draws, one row of logits each
    for depth, width in enumerate(widths):
        start = len(drafted)
        drawing = u[start:] if depth_uniforms is None else (depth_uniforms[depth],) * (len(frontier) * width)
        branched = yield replace(feed, ask=Branch(params, width, drawing, rule))
        for node, kids, probs in zip(frontier, branched.children, branched.probs):
            drafted.extend(kids)
            parents.extend([node] * len(kids))
            token_probs.extend(probs)
        dists.extend(branched.distributions)
        frontier = list(range(start, len(drafted)))
        # This depth's nodes after the earlier ones, which the cache holds.
        feed = step(session_id, position + start, drafted[start:], keep=len(frontier), parents=tuple(parents))
    return wire.Proposal(drafted, token_probs, dists, 0.0, parents=parents)


def tree_rule(request) -> str:
    """A Propose or Verify request's tree rule, "rrsw" when unspecified, or INVALID_ARGUMENT naming it."""
    return TREE_RULE.from_pb(request.tree_rule) or "rrsw"


def is_tree(widths: list[int]) -> bool:
    """Whether widths make a tree with branches (all ones: a chain, drafted as one)."""
    return any(w > 1 for w in widths)


def drafted(request) -> int:
    """The tokens a checked ProposeRequest asks for: gamma, or its tree's nodes."""
    if request.tree_widths:
        return tree.size(list(request.tree_widths))
    return request.gamma * max(1, request.ahead_guesses)


def guesses(request) -> int:
    """A ProposeRequest's guesses of the bonus token (ahead_guesses; 0 is 1), or INVALID_ARGUMENT."""
    if request.ahead_guesses > 1 and not request.ahead:
        raise invalid("ahead_guesses", "guesses a block's bonus token: needs ahead")
    if request.ahead_guesses > 1 and request.tree_widths:
        raise invalid("ahead_guesses", "drafts a chain under each guess: not with tree_widths")
    if request.ahead_guesses * request.gamma > MAX_GAMMA:
        raise invalid("ahead_guesses", f"{request.ahead_guesses} guesses × gamma {request.gamma} nodes; "
                                       f"at most {MAX_GAMMA}")
    return max(1, request.ahead_guesses)


def check_tree_widths(widths: list[int], gamma: int, name: str = "tree_widths", depth: str = "gamma") -> None:
    """A request's tree widths (field `name`, the depth field `depth`), or INVALID_ARGUMENT naming them."""
    if not widths:
        return
    if len(widths) != gamma:
        raise invalid(name, f"need one width per depth: {gamma} ({depth}), got {len(widths)}")
    if min(widths) < 1:
        raise invalid(name, f"every width must be at least 1, got {widths}")
    nodes = tree.size(widths)
    if nodes > MAX_GAMMA:
        raise invalid(name, f"the tree has {nodes} nodes; at most {MAX_GAMMA}")


class DraftWorkerServicer(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    service = "tandem.v1.DraftWorker"
    register = staticmethod(worker_pb2_grpc.add_DraftWorkerServicer_to_server)

    def prepare(self, request) -> Work:
        self.check_sequence(request.session_id, request.cache_len, request.tokens)
        if not 1 <= request.gamma <= MAX_GAMMA:
            raise invalid("gamma", f"must be in [1, {MAX_GAMMA}], got {request.gamma}")
        check_tree_widths(list(request.tree_widths), request.gamma)
        guesses(request)
        tree_rule(request)
        end = request.cache_len + len(request.tokens) + drafted(request) - 1
        check_context("gamma", end, self.runtime.info.max_context)
        params = self.check_sampling(request.sampling)
        job, probs = self.draft(request, params)
        return Work(job, len(request.tokens) >= LARGE_TOKENS or probs >= LARGE_PROBS, request.writer_epoch)

    async def Propose(self, request, context):
        return await self.answer(context, "Propose", request, lambda: self.compute(self.prepare(request)),
                                 wire.propose_response)

    async def ProposeBatch(self, request, context):
        return await self.answer_rows(context, "Propose", "ProposeBatch", request.rows, wire.propose_response)

    def draft(self, request, params: SamplingParams) -> tuple[Job, int]:
        """The job that answers a checked request, and how many probabilities it returns."""
        widths, k = list(request.tree_widths), guesses(request)
        args = (request.session_id, request.cache_len, list(request.tokens))
        if is_tree(widths):
            job = propose_tree(*args, widths, params, rule=tree_rule(request))
        elif k > 1:
            job = propose_ahead(*args, request.gamma, k, params)
        else:
            job = propose(*args, request.gamma, params, ahead=request.ahead)
        return job, self.returned_probs(request, params)

    def returned_probs(self, request, params: SamplingParams) -> int:
        """How many probabilities a checked request's answer holds at most: the draft's whole
        distribution per drafted token when sampling, none when greedy."""
        return 0 if params.greedy else drafted(request) * self.runtime.info.vocab_size

    def ProposeStream(self, requests, context):
        return self.in_order(requests, lambda request: self.Propose(request, context))

    def ProposeBatchStream(self, requests, context):
        return self.in_order(requests, lambda request: self.ProposeBatch(request, context))


add_to_server = DraftWorkerServicer.add_to_server
