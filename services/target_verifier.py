"""The target verifier: one forward pass over the committed tail and the draft block."""

import torch

from tandem import rules
from tandem.math import tree
from tandem.math.params import SamplingParams
from tandem.services import distributions, draft_worker
from tandem.services.batching import Job
from tandem.services.limits import MAX_GAMMA
from tandem.services.runtime import KeepPath, KeptBlock, ModelRuntime, Step
from tandem.services.sampler import Check, CheckTree
from tandem.services.server import LARGE_PROBS, LARGE_TOKENS, Work, WorkerServicer
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.generation import VERIFICATION
from tandem.wire.validation import check_context, check_token_ids, invalid


def verify(
    session_id: str, cache_len: int, tokens: list[int], draft_tokens: list[int],
    draft_probs: torch.Tensor | None, params: SamplingParams, rule: rules.ChainRule = rules.TOKEN,
    dropped: bool = False,
) -> Job:
    """The job (tandem.services.batching) that checks a draft block in one step, with the
    round's others (tandem.services.sampler.Check) → a Verification. draft_probs [γ, V], or None
    for one-hot drafts. Raises CacheMiss. A sampled request's answer is its rule's (tandem.rules:
    block verification's carries h, and recovered tokens from its residuals); greedy, every chain
    rule is the same. dropped: the caller's held block was dropped (no block, answered so).

    The cache ends holding the committed tokens and the whole draft block; the orchestrator's
    next cache_len crops the rejected part away.
    """
    gamma = len(draft_tokens)
    position = cache_len + len(tokens)  # absolute position of the first drafted token
    checked = yield Step(session_id, cache_len, tokens + draft_tokens, keep=gamma + 1,
                         ask=Check(params, tuple(draft_tokens), draft_probs, position, rule))
    return wire.Verification(checked.target_token_probs, checked.recovered_tokens, checked.bonus_token, 0.0,
                             block_accept_probs=checked.block_accept_probs, dropped_block=dropped)


def verify_tree(
    session_id: str, cache_len: int, tokens: list[int], draft: tree.Tree, draft_probs: torch.Tensor | None,
    params: SamplingParams, rule: str = "rrsw",
) -> Job:
    """The job that checks a token tree in one step → a Verification of its tree_* fields.
    draft_probs [e, V]: the draft's distribution at each node with children (tree.expanded
    order); None when greedy. rule: how the draft drew the children ("rrsw", "greedy"). Raises
    CacheMiss.

    The committed tail and the tree run as one tree (the tail a chain above the root), every
    node at its depth's position seeing only its path. Then the job walks the tree with the
    orchestrator's uniforms and keeps that path's keys and values after the committed tokens,
    which is what the orchestrator's next cache_len says (where it walks otherwise, it crops).
    """
    m, n = len(tokens), len(draft)
    position = cache_len + m  # absolute position of the depth-1 nodes
    parents = tuple(range(-1, m - 1)) + tuple(p + m if p >= 0 else m - 1 for p in draft.parents)
    verdict = yield Step(session_id, cache_len, tokens + list(draft.tokens), keep=n + 1, parents=parents,
                         ask=CheckTree(params, draft, draft_probs, position, rule))
    path = rules.TREE.path(draft, verdict.accept_probs, params.seed, position)  # the orchestrator's walk
    kept = yield KeepPath(session_id, position, path)
    return wire.Verification([], [], 0, 0.0, tree_accept_probs=verdict.accept_probs,
                             tree_recovered_tokens=verdict.recovered, kept_path=path if kept else [])


class TargetVerifierServicer(WorkerServicer, worker_pb2_grpc.TargetVerifierServicer):
    service = "tandem.v1.TargetVerifier"
    register = staticmethod(worker_pb2_grpc.add_TargetVerifierServicer_to_server)

    def prepare(self, request) -> Work:
        self.check_sequence(request.session_id, request.cache_len, request.tokens)
        info = self.runtime.info
        if len(request.draft_tokens) > MAX_GAMMA:
            raise invalid("draft_tokens", f"at most {MAX_GAMMA} tokens")
        check_token_ids("draft_tokens", request.draft_tokens, info.vocab_size)
        end = request.cache_len + len(request.tokens) + len(request.draft_tokens)
        check_context("draft_tokens", end, info.max_context)
        params = self.check_sampling(request.sampling)
        rule = rules.CHAIN_RULES[VERIFICATION.from_pb(request.verification) or "token"]
        draft = _tree(request)
        # One draft distribution per drafted token, or per node with children in a tree.
        rows = len(tree.expanded(draft.parents)) if draft else len(request.draft_tokens)
        position = request.cache_len + len(request.tokens)  # the block's first token's
        messages, dropped = _distributions(request, self.runtime.kept_block(request.session_id, position), rows)
        drafted = [] if dropped else list(request.draft_tokens)
        draft = None if dropped else draft
        if messages and len(messages) != rows:
            raise invalid("draft_distributions", "need one per drafted token (a tree: per node with children)")
        if not messages and drafted and not params.greedy:
            raise invalid("draft_distributions", "required when sampling (temperature > 0)")
        probs = 0 if params.greedy else (len(drafted) + 1) * info.vocab_size
        args = (request.session_id, request.cache_len, list(request.tokens))
        tree_rule = draft_worker.tree_rule(request)
        if draft:
            def make(draft_probs):
                return verify_tree(*args, draft, draft_probs, params, tree_rule)
        else:
            def make(draft_probs):
                return verify(*args, drafted, draft_probs, params, rule, dropped)
        job = _decoding(make, messages, info.vocab_size)
        if request.next_gamma:
            self._check_next(request)
        then = (_next_block(request, drafted, messages, draft, params, rule, tree_rule, info.max_context,
                            self.runtime.draft_step) if request.next_gamma else None)
        keep = request.keep_next_distributions and not params.greedy
        finish = _keeping(self.runtime, request.session_id, position) if keep else _with_block
        return Work(job, len(request.tokens) >= LARGE_TOKENS or probs >= LARGE_PROBS, request.writer_epoch, then,
                    finish)

    def _check_next(self, request) -> None:
        if not self.runtime.info.drafter:
            raise invalid("next_gamma", "this verifier does not draft: start it with --head, or draft with "
                          "draft workers")
        if request.next_gamma > MAX_GAMMA:
            raise invalid("next_gamma", f"at most {MAX_GAMMA} tokens")
        draft_worker.check_tree_widths(list(request.next_tree_widths), request.next_gamma, "next_tree_widths",
                                       "next_gamma")

    async def Verify(self, request, context):
        return await self.answer(context, "Verify", request, lambda: self.compute(self.prepare(request)),
                                 wire.verify_response)

    async def VerifyBatch(self, request, context):
        return await self.answer_rows(context, "Verify", "VerifyBatch", request.rows, wire.verify_response)

    def VerifyStream(self, requests, context):
        return self.in_order(requests, lambda request: self.Verify(request, context))

    def VerifyBatchStream(self, requests, context):
        return self.in_order(requests, lambda request: self.VerifyBatch(request, context))


def _next_block(request, drafted: list[int], messages: list, draft: tree.Tree | None, params: SamplingParams,
                rule: rules.ChainRule, tree_rule: str, max_context: int, step: type[Step]):
    """What follows a verify that asks for the next block: from its Verification, walk the block
    (drafted, with the distributions `messages`; a token tree's `draft`) as the orchestrator will
    (its rule, or the tree rule for a token tree; its counter-based uniforms; the draft
    probabilities it holds), then the work that drafts the next block after that outcome (a
    chain of next_gamma tokens, or a tree that deep of next_tree_widths), keyed as a draft
    worker's call from there would key it (None when it does not fit the context); a tree's
    children drawn by tree_rule. step: the runtime's drafting step (tandem.services.head_runtime,
    self_draft)."""
    position = request.cache_len + len(request.tokens)  # the first drafted token's
    # A tree's walk needs no draft probabilities: its verdict carries each node's acceptance.
    draft_probs = distributions.token_probs(messages, drafted) if messages and not draft else [1.0] * len(drafted)
    block = wire.Proposal(drafted, draft_probs, [], 0.0, parents=list(draft.parents) if draft else [])

    def then(verification: wire.Verification) -> Work | None:
        if draft:
            outcome = rules.TREE.accept(block, verification, params.seed, position)
        elif drafted:
            outcome = rule.accept(block, verification, params.seed, position)
        else:
            outcome = rules.Outcome(0, [verification.bonus_token], 0)
        committed = position + len(outcome.tokens)
        verification.next_accepted, verification.next_token = outcome.accepted, outcome.tokens[-1]
        widths = _fitting(list(request.next_tree_widths) or [1] * request.next_gamma, max_context - committed)
        if not widths:
            return None
        args = (request.session_id, committed - 1, outcome.tokens[-1:])
        job = (draft_worker.propose_tree(*args, widths, params, step=step, rule=tree_rule)
               if draft_worker.is_tree(widths)
               else draft_worker.propose(*args, len(widths), params, step=step))
        return Work(job, False, request.writer_epoch)

    return then


def _fitting(widths: list[int], room: int) -> list[int]:
    """A block's widths per depth (a chain's all 1), cut to the depths whose nodes fit in `room`
    positions of context: a prefix drafts what a shallower call would have, draws and all."""
    while widths and tree.size(widths) > room:
        widths = widths[:-1]
    return widths


def _with_block(verification: wire.Verification, block: wire.Proposal) -> None:
    verification.next_block = block


def _keeping(runtime: ModelRuntime, session_id: str, position: int):
    """_with_block, the block's distributions kept here with the session's cache instead
    (keep_next_distributions): the next call verifies the block with held_distributions. Where
    the cache lost the session meanwhile, the block carries them. position: the verified block's
    first token's."""

    def finish(verification: wire.Verification, block: wire.Proposal) -> None:
        start = position + verification.next_accepted + 1  # the next block's first token: after the outcome
        if block.draft_distributions and runtime.keep_block(session_id, KeptBlock(
                start, tuple(block.draft_tokens), tuple(block.parents), tuple(block.draft_distributions))):
            block.draft_distributions, block.held = [], True
        _with_block(verification, block)

    return finish


def _distributions(request, kept: KeptBlock | None, rows: int) -> tuple[list, bool]:
    """The block's draft distributions → (their messages, whether the block is dropped): the
    request's, or with held_distributions the first `rows` of the block this verifier kept at
    the block's position (`kept`), where it kept that block; where not (it lost the session's
    cache, moved past the block, or another verifier drafted it), the block is dropped: verified
    as no block."""
    if not request.held_distributions:
        return list(request.draft_distributions), False
    if request.draft_distributions:
        raise invalid("draft_distributions", "must be empty with held_distributions: the verifier keeps them")
    if kept is None or not kept.holds(request.draft_tokens, request.draft_parents):
        return [], True
    return list(kept.distributions[:rows]), False


def _decoding(make, messages, vocab_size: int) -> Job:
    """The job make(draft_probs) after decoding the draft distributions into draft_probs [rows, V]
    (None for none), on the model thread: the bytes' checks (ids in the vocabulary, finite,
    non-negative probabilities) are vectorized there, off the event loop. INVALID_ARGUMENT
    names draft_distributions."""
    draft_probs = None
    if messages:
        try:
            draft_probs = distributions.unpack(messages, vocab_size)
        except ValueError as e:
            raise invalid("draft_distributions", str(e)) from None
    return (yield from make(draft_probs))


def _tree(request) -> tree.Tree | None:
    """The request's token tree, None for a chain, or INVALID_ARGUMENT naming draft_parents."""
    if not request.draft_parents:
        return None
    if len(request.draft_parents) != len(request.draft_tokens):
        raise invalid("draft_parents", "need one per drafted token")
    try:
        return tree.Tree(tuple(request.draft_tokens), tuple(request.draft_parents))
    except ValueError as e:
        raise invalid("draft_parents", str(e)) from None


add_to_server = TargetVerifierServicer.add_to_server
