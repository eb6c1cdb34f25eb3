"""The draft worker: extends a session's cache, then drafts γ tokens autoregressively."""

from dataclasses import replace

from tandem.math import tree
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.services.batching import Job
from tandem.services.limits import MAX_GAMMA
from tandem.services.runtime import Step
from tandem.services.sampler import Branch, Draw, Top
from tandem.services.server import LARGE_PROBS, LARGE_TOKENS, Work, WorkerServicer
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.generation import TREE_RULE
from tandem.wire.validation import check_context, invalid


def propose(
    session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
    step: type[Step] = Step,
) -> Job:
    """The job (tandem.services.batching) that drafts gamma tokens after the committed
    sequence, one step per drafted token, each drawn with the round's others
    (tandem.services.sampler.Draw) → a Proposal. Raises CacheMiss. step: the kind of Step it
    yields (the hybrid drafter marks those its model runs).

    The cache ends holding the committed tokens and the first γ−1 drafted ones (the last
    drafted token is never fed: the verifier may reject it).
    """
    position = cache_len + len(tokens)  # absolute position of the first drafted token
    u = [] if params.greedy else draw_uniforms(params.seed, position, gamma)
    drawn = yield step(session_id, cache_len, tokens, keep=1, ask=Draw(params, u[0] if u else 0.0))
    draws = [drawn]
    for i in range(1, gamma):
        drawn = yield step(session_id, position + i - 1, [drawn.token], keep=1,
                           ask=Draw(params, u[i] if u else 0.0))
        draws.append(drawn)
    # Greedy drafts are one-hot: the verifier rebuilds them from the token ids alone.
    packed = [] if params.greedy else [d.distribution for d in draws]
    return wire.Proposal([d.token for d in draws], [d.prob for d in draws], packed, 0.0)


def draw_uniforms(seed: int, position: int, gamma: int) -> list[float]:
    """The uniforms of a chain's γ draws from `position` on, keyed by the cycle they draft for
    (tandem.math.rng): the one whose first drafted token sits there."""
    return cycle_uniforms(seed, position, gamma, Purpose.DRAFT)


def propose_ahead(
    session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams, guesses: int = 1,
    block: int = 0, rejections: int = 0, step: type[Step] = Step,
) -> Job:
    """The job that drafts past a block under verification for its likeliest outcomes, each
    ending with a guess of the token the verify will end with (tandem.services.sampler.Top):
    the block accepted whole, then each of the draft's `guesses` most likely next tokens (the
    bonus); and for each of the block's first `rejections` positions j, its first j tokens
    accepted, then the draft's most likely token there other than the drafted one (the
    recovered token). Under each guess it drafts γ − 1 tokens, drawn as a call drafting after
    that guess would draw them (tandem.math.rng: keyed by the position they start at) → a token
    tree whose root's children are the guesses, anchored (Proposal.anchors) where rejections
    were drafted past. Raises CacheMiss.

    `tokens` end with the block (its last `block`; with rejections, the token before it as well,
    whose row drafts its first position). One step reads the guesses; then one step per depth
    runs every chain's next node under the tree mask, the block itself the tree's trunk where a
    guess hangs inside it. The cache ends holding the committed tokens and the block, then the
    tree's nodes but the last depth's."""
    trunk = block if rejections else 0  # the block's tokens, as the tree's first nodes
    root = cache_len + len(tokens) - trunk  # where the tree hangs: before the block, or after it
    count = max(guesses, 2 if rejections else 1)
    tops = yield step(session_id, cache_len, tokens, keep=trunk + 1, ask=Top(params, count))
    drafted = tokens[len(tokens) - trunk:]
    # (anchor: the block's tokens before the guess, the guess, its draft probability)
    chosen = [(trunk, token, prob) for token, prob in tops[-1][:guesses]]
    for j in range(rejections):
        chosen += [(j, token, prob) for token, prob in tops[j] if token != drafted[j]][:1]
    parents = list(range(-1, trunk - 1)) + [anchor - 1 for anchor, _, _ in chosen]  # the trunk a chain
    nodes, probs = [token for _, token, _ in chosen], [prob for _, _, prob in chosen]
    # A guess at the tree's depth d sits at position root + d − 1; the chain after it starts next.
    u = [None if params.greedy else draw_uniforms(params.seed, root + anchor + 1, gamma - 1) for anchor, _, _ in chosen]
    frontier, dists = list(range(trunk, len(parents))), []
    for depth in range(gamma - 1 if chosen else 0):
        drawing = () if params.greedy else tuple(chain[depth] for chain in u)
        branched = yield step(session_id, root + len(parents) - len(frontier), [nodes[n - trunk] for n in frontier],
                              keep=len(frontier), parents=tuple(parents),
                              ask=Branch(params, 1, drawing, "greedy"))  # one child: a draw, as a chain's
        parents += frontier
        frontier = list(range(len(parents) - len(frontier), len(parents)))
        nodes += [kids[0] for kids in branched.children]
        probs += [p[0] for p in branched.probs]
        dists += branched.distributions
    anchors = [anchor for anchor, _, _ in chosen] if rejections else []
    return wire.Proposal(nodes, probs, dists, 0.0, parents=[max(p - trunk, -1) for p in parents[trunk:]],
                         anchors=anchors)


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
    return request.gamma * (guesses(request) + request.ahead_rejections if request.ahead else 1)


def guesses(request) -> int:
    """A ProposeRequest's guesses of the bonus token (ahead_guesses; 0 is 1), or INVALID_ARGUMENT
    naming the ahead field that does not fit."""
    if not request.ahead:
        for name in ("ahead_guesses", "ahead_block", "ahead_rejections"):
            if getattr(request, name):
                raise invalid(name, "drafts past a block under verification: needs ahead")
        return 1
    if request.tree_widths:
        raise invalid("tree_widths", "a tree of its own: not with ahead (a chain under each guess)")
    if request.ahead_rejections > request.ahead_block:
        raise invalid("ahead_rejections", f"{request.ahead_rejections} rejections in a block of {request.ahead_block} "
                                          "(ahead_block)")
    if request.ahead_rejections and request.ahead_block >= len(request.tokens):
        raise invalid("ahead_block", f"{request.ahead_block} tokens: `tokens` holds the block and the token before "
                                     f"it, {len(request.tokens)} in all")
    k = max(1, request.ahead_guesses)
    if (k + request.ahead_rejections) * request.gamma > MAX_GAMMA:
        raise invalid("ahead_guesses", f"({k} guesses + {request.ahead_rejections} rejections) × gamma "
                                       f"{request.gamma} nodes; at most {MAX_GAMMA}")
    return k


def ahead(request) -> dict:
    """A checked ProposeRequest's outcomes to draft past (propose_ahead's keywords)."""
    return {"guesses": guesses(request), "block": request.ahead_block, "rejections": request.ahead_rejections}


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
        widths = list(request.tree_widths)
        args = (request.session_id, request.cache_len, list(request.tokens))
        if is_tree(widths):
            job = propose_tree(*args, widths, params, rule=tree_rule(request))
        elif request.ahead:
            job = propose_ahead(*args, request.gamma, params, **ahead(request))
        else:
            job = propose(*args, request.gamma, params)
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
