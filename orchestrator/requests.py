"""Validation at the edge: a decoded GenerateRequest becomes a fully resolved request (a
session's frozen `Request` and its prompt's token ids), or a FieldError naming the field and
the gRPC status to answer with."""

import secrets
from dataclasses import dataclass

import grpc

from tandem.math.params import SamplingParams
from tandem.orchestrator.session import Request
from tandem.wire.generation import GenerationRequest
from tandem.wire.validation import FieldError, check_sampling, check_token_ids, invalid, out_of_range
from tandem.wire.worker import ModelInfo

CHARS_PER_TOKEN_BOUND = 32


@dataclass(frozen=True)
class Limits:
    """What the cluster accepts: from both workers' models and the orchestrator's config."""

    vocab_size: int  # the smaller logits width of the two models
    max_context: int  # the smaller context of the two models
    max_gamma: int
    max_tokens_cap: int
    default_max_tokens: int
    default_verification: str  # for a request that does not say
    default_draft_shape: str = "chain"  # likewise
    tree_widths: tuple[int, ...] = (2, 2)  # every request's trees
    default_tree_rule: str = "rrsw"  # for a request that does not say

    @property
    def max_prompt_chars(self) -> int:
        """The longest text prompt tokenized at all: a bound checked before tokenizing, far above
        what fills the context (code and prose run at 3–5 characters per token)."""
        return CHARS_PER_TOKEN_BOUND * self.max_context

    @classmethod
    def of(cls, draft: ModelInfo, target: ModelInfo, max_gamma: int, max_tokens_cap: int,
           default_max_tokens: int, default_verification: str, default_draft_shape: str = "chain",
           tree_widths: tuple[int, ...] = (2, 2), default_tree_rule: str = "rrsw") -> "Limits":
        return cls(min(draft.vocab_size, target.vocab_size), min(draft.max_context, target.max_context),
                   max_gamma, max_tokens_cap, default_max_tokens, default_verification, default_draft_shape,
                   tree_widths, default_tree_rule)


def resolve(req: GenerationRequest, limits: Limits, tokenizer) -> tuple[list[int], Request]:
    """→ the prompt's token ids and the session's request."""
    prompt = _prompt_ids(req, limits, tokenizer)
    room = limits.max_context - len(prompt)
    if room < 1:
        raise out_of_range("prompt", f"{len(prompt)} tokens leave no room in the context of {limits.max_context}")
    if req.max_tokens == 0:
        max_tokens = min(limits.default_max_tokens, room)
    elif req.max_tokens > limits.max_tokens_cap:
        raise out_of_range("max_tokens", f"at most {limits.max_tokens_cap}, got {req.max_tokens}")
    elif req.max_tokens > room:
        raise out_of_range("max_tokens", f"prompt ({len(prompt)}) + max_tokens ({req.max_tokens}) "
                           f"exceeds the context of {limits.max_context}")
    else:
        max_tokens = req.max_tokens
    temperature = 1.0 if req.temperature is None else req.temperature
    top_k = req.top_k or 0
    top_p = 1.0 if req.top_p is None else req.top_p
    check_sampling(temperature, top_k, top_p)
    seed = secrets.randbits(63) if req.seed is None else req.seed
    if req.gamma is not None:
        if req.gamma < 0:
            raise invalid("gamma", f"must be >= 0 (or unset for adaptive), got {req.gamma}")
        if req.gamma > limits.max_gamma:
            raise out_of_range("gamma", f"at most {limits.max_gamma}, got {req.gamma}")
    return prompt, Request(SamplingParams(temperature, top_k, top_p, seed), len(prompt), max_tokens, req.gamma,
                           req.verification or limits.default_verification,
                           req.draft_shape or limits.default_draft_shape, limits.tree_widths, req.ignore_eos,
                           req.tree_rule or limits.default_tree_rule)


def _prompt_ids(req: GenerationRequest, limits: Limits, tokenizer) -> list[int]:
    if req.prompt and req.prompt_token_ids:
        raise invalid("prompt", "set either prompt or prompt_token_ids, not both")
    if req.prompt_token_ids:
        if len(req.prompt_token_ids) >= limits.max_context:
            raise out_of_range("prompt_token_ids", f"{len(req.prompt_token_ids)} tokens leave no room in the "
                               f"context of {limits.max_context}")
        check_token_ids("prompt_token_ids", req.prompt_token_ids, limits.vocab_size)
        return list(req.prompt_token_ids)
    if not req.prompt:
        raise invalid("prompt", "one of prompt or prompt_token_ids is required")
    if tokenizer is None:
        raise FieldError(grpc.StatusCode.FAILED_PRECONDITION, "prompt",
                         "the server has no tokenizer for this model; send prompt_token_ids")
    if len(req.prompt) > limits.max_prompt_chars:  # before tokenizing: its cost grows with the text
        raise out_of_range("prompt", f"{len(req.prompt)} characters, at most {limits.max_prompt_chars} "
                           f"({CHARS_PER_TOKEN_BOUND} per token of the {limits.max_context}-token context)")
    ids = tokenizer.encode(req.prompt)
    if not ids:
        raise invalid("prompt", "encodes to no tokens")
    check_token_ids("prompt", ids, limits.vocab_size)
    return ids
