"""The target verifier: one forward pass over the committed tail and the draft block."""

import torch

from tandem.math import tree, tree_sampling
from tandem.math.block import block_verdict
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, node_uniforms, uniform, uniforms
from tandem.math.sampling import verify_block, verify_greedy, warp
from tandem.services import distributions
from tandem.services.batching import DEFAULT_BATCH_TOKENS, Job
from tandem.services.limits import MAX_GAMMA
from tandem.services.runtime import KeepPath, ModelRuntime, Step
from tandem.services.server import LARGE_PROBS, LARGE_TOKENS, WorkerServicer
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.generation import verification_mode_from_pb
from tandem.wire.validation import check_context, check_token_ids, invalid


def verify(
    session_id: str, cache_len: int, tokens: list[int], draft_tokens: list[int],
    draft_probs: torch.Tensor | None, params: SamplingParams, verification: str = "token",
) -> Job:
    """The job (tandem.services.batching) that checks a draft block in one step → a
    Verification. draft_probs [γ, V], or None for one-hot drafts. Raises CacheMiss. With
    verification "block" (and a sampled request) the answer carries block verification's h and
    recovered tokens from its residuals; greedy, both modes are the same.

    The cache ends holding the committed tokens and the whole draft block; the orchestrator's
    next cache_len crops the rejected part away.
    """
    gamma = len(draft_tokens)
    position = cache_len + len(tokens)  # absolute position of the first drafted token
    logits = yield Step(session_id, cache_len, tokens + draft_tokens, keep=gamma + 1)  # [γ+1, V]
    drafts = torch.tensor(draft_tokens, dtype=torch.long)  # [γ]
    if params.greedy:
        verdict = verify_greedy(logits, drafts)
    else:
        target_probs = warp(logits, params)  # [γ+1, V]
        if draft_probs is None:
            draft_probs = torch.nn.functional.one_hot(drafts, target_probs.shape[-1]).float()
        verdict = (block_verdict if verification == "block" else verify_block)(
            target_probs, drafts, draft_probs,
            torch.tensor(uniforms(params.seed, position, gamma, Purpose.RECOVERED), dtype=torch.float64),
            uniform(params.seed, position + gamma, Purpose.BONUS),
        )
    h = verdict.block_accept_probs
    return wire.Verification(
        verdict.target_token_probs.tolist(), verdict.recovered_tokens.tolist(),
        verdict.bonus_token, 0.0, block_accept_probs=[] if h is None else h.tolist(),
    )


def verify_tree(
    session_id: str, cache_len: int, tokens: list[int], draft: tree.Tree, draft_probs: torch.Tensor | None,
    params: SamplingParams,
) -> Job:
    """The job that checks a token tree in one step → a Verification of its tree_* fields.
    draft_probs [e, V]: the draft's distribution at each node with children (tree.expanded
    order); None when greedy. Raises CacheMiss.

    The committed tail and the tree run as one tree (the tail a chain above the root), every
    node at its depth's position seeing only its path. Then the job walks the tree with the
    orchestrator's uniforms and keeps that path's keys and values after the committed tokens,
    which is what the orchestrator's next cache_len says (where it walks otherwise, it crops).
    """
    m, n = len(tokens), len(draft)
    position = cache_len + m  # absolute position of the depth-1 nodes
    parents = tuple(range(-1, m - 1)) + tuple(p + m if p >= 0 else m - 1 for p in draft.parents)
    logits = yield Step(session_id, cache_len, tokens + list(draft.tokens), keep=n + 1, parents=parents)  # [n+1, V]
    if params.greedy:
        verdict = tree.greedy_verdict(draft, logits.argmax(-1).tolist())
    else:
        target_probs = warp(logits, params)  # [n+1, V]
        u_residual = node_uniforms(params.seed, position, n + 1, Purpose.TREE_RECOVERED)
        verdict = tree_sampling.verdict(draft, target_probs, draft_probs, u_residual)
    # As the wire carries them: the orchestrator walks with these float32 values.
    accept_probs = torch.tensor(verdict.accept_probs, dtype=torch.float32).tolist()
    path = tree.walk(draft, accept_probs, node_uniforms(params.seed, position, n, Purpose.TREE_ACCEPT))
    kept = yield KeepPath(session_id, position, path)
    return wire.Verification([], [], 0, 0.0, tree_accept_probs=accept_probs,
                             tree_recovered_tokens=verdict.recovered, kept_path=path if kept else [])


class TargetVerifierServicer(WorkerServicer, worker_pb2_grpc.TargetVerifierServicer):
    service = "tandem.v1.TargetVerifier"

    async def Verify(self, request, context):
        async def work():
            self.check_sequence(request.session_id, request.cache_len, request.tokens)
            info = self.runtime.info
            if len(request.draft_tokens) > MAX_GAMMA:
                raise invalid("draft_tokens", f"at most {MAX_GAMMA} tokens")
            check_token_ids("draft_tokens", request.draft_tokens, info.vocab_size)
            end = request.cache_len + len(request.tokens) + len(request.draft_tokens)
            check_context("draft_tokens", end, info.max_context)
            params = self.check_sampling(request.sampling)
            try:
                verification = verification_mode_from_pb(request.verification) or "token"
            except ValueError as e:
                raise invalid("verification", str(e)) from None
            draft = _tree(request)
            # One draft distribution per drafted token, or per node with children in a tree.
            rows = len(tree.expanded(draft.parents)) if draft else len(request.draft_tokens)
            draft_probs = None
            if request.draft_distributions:
                if len(request.draft_distributions) != rows:
                    raise invalid("draft_distributions", "need one per drafted token (a tree: per node with children)")
                try:
                    draft_probs = distributions.unpack(request.draft_distributions, info.vocab_size)
                except ValueError as e:
                    raise invalid("draft_distributions", str(e)) from None
            elif request.draft_tokens and not params.greedy:
                raise invalid("draft_distributions", "required when sampling (temperature > 0)")
            probs = 0 if params.greedy else (len(request.draft_tokens) + 1) * info.vocab_size
            args = (request.session_id, request.cache_len, list(request.tokens))
            if draft:
                job = verify_tree(*args, draft, draft_probs, params)
            else:
                job = verify(*args, list(request.draft_tokens), draft_probs, params, verification)
            return await self.compute(job, large=len(request.tokens) >= LARGE_TOKENS or probs >= LARGE_PROBS)

        return await self.answer(context, "Verify", request, work, wire.verify_response)

    async def VerifyStream(self, requests, context):
        async for request in requests:
            response = await self.Verify(request, context)
            if response is None:  # refused: the status set on the context ends the stream
                return
            yield response


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


def add_to_server(runtime: ModelRuntime, server, max_batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
    worker_pb2_grpc.add_TargetVerifierServicer_to_server(TargetVerifierServicer(runtime, max_batch_tokens), server)
