"""How large a worker's messages may be, sized from its model.

gRPC reads a message's length from its 5-byte prefix and answers RESOURCE_EXHAUSTED to one over
the receive limit before the worker parses it, so the limit bounds what a request can make the
worker allocate. A limit only has to hold the largest *valid* message: a generic 64 MiB let one
request carry 50 MB of token ids that the worker parsed into ~470 MiB of objects before refusing
them for exceeding the context.

Sizes (protobuf encoding):
- a token id is an int32 in [0, vocab) and cache_len, gamma are uint32: at most 5 bytes each;
- every call's tokens (Verify: with the draft block) fit the model's context, or are refused;
- a DraftDistribution that the verifier accepts names each token at most once, so it is at
  most 8 bytes per vocabulary entry (sparse: int32 id + float32 prob; dense: 4); the draft worker
  packs sparse only when that is the smaller, so it sends at most 4 bytes per entry;
- FIXED_BYTES covers the rest.
"""

from dataclasses import dataclass

MAX_GAMMA = 64  # drafted tokens per call: Propose's gamma, Verify's draft block

VARINT_BYTES = 5  # a token id or any uint32 as a varint
FIELD_BYTES = 11  # a length-delimited field's tag (1) and length (up to 10)
# Everything but token ids and distributions, with room to spare: a session id (128 characters,
# up to 512 bytes of UTF-8), cache_len, gamma, the sampling parameters (~40 bytes), a W3C trace
# context (traceparent 55 bytes, tracestate up to 512, baggage up to 8192), tags and lengths;
# in answers, ModelInfo's model path (up to 4096 bytes) and the health service's messages.
FIXED_BYTES = 64 << 10


@dataclass(frozen=True)
class MessageLimits:
    """gRPC's max_receive_message_length and max_send_message_length for one worker."""

    receive: int
    send: int

    def grpc_options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", self.receive), ("grpc.max_send_message_length", self.send)]


def draft_limits(vocab_size: int, max_context: int) -> MessageLimits:
    """A draft worker receives committed tokens and sends a block of γ tokens, their
    probabilities and (sampling) their packed distributions."""
    position = 3 * FIELD_BYTES + VARINT_BYTES + 4 + 4 * vocab_size  # token, prob, distribution
    return MessageLimits(receive=FIXED_BYTES + VARINT_BYTES * max_context, send=FIXED_BYTES + MAX_GAMMA * position)


def target_limits(vocab_size: int, max_context: int, drafts: bool = False) -> MessageLimits:
    """A target verifier receives committed tokens, the draft block and its distributions (any
    valid packing), and sends O(γ) numbers; one that drafts (drafts) also sends the next block,
    as a draft worker does."""
    distribution = 3 * FIELD_BYTES + 8 * vocab_size
    receive = FIXED_BYTES + VARINT_BYTES * max_context + MAX_GAMMA * distribution
    send = FIXED_BYTES + MAX_GAMMA * (VARINT_BYTES + 4)
    if drafts:
        send += draft_limits(vocab_size, max_context).send
    return MessageLimits(receive=receive, send=send)


def message_limits(kind: str, vocab_size: int, max_context: int, drafts: bool = False) -> MessageLimits:
    """The limits of a "draft" or "target" worker (one that drafts: drafts) for a model of this
    vocabulary and context."""
    if kind == "target":
        return target_limits(vocab_size, max_context, drafts)
    return draft_limits(vocab_size, max_context)


def any_worker_limits(vocab_size: int, max_context: int) -> MessageLimits:
    """Limits that hold what either kind of worker takes and sends (for a server that does not say
    which kind it is)."""
    draft, target = draft_limits(vocab_size, max_context), target_limits(vocab_size, max_context, drafts=True)
    return MessageLimits(max(draft.receive, target.receive), max(draft.send, target.send))
