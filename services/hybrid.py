"""The hybrid draft worker: the n-gram lookup (tandem.services.ngram) where the context's
suffix occurred before, the draft model where it did not.

Both halves keep a session: the token list the lookup searches (NgramRuntime's, which every
call crops and extends as the cache contract says) and the model's KV cache, which only model
drafts feed. So the model's cache may lag the list: it agrees with the list's first `fed`
tokens, the lowest point the list was cropped to since the model last ran. When the lookup
finds nothing, the model's first step feeds the list from there (the tokens committed, or
drafted by lookup, since), then it drafts as the draft worker does. The lookup's drafts are
one-hot, the model's are its distributions; each proposal is one or the other, chosen from the
context alone, so verification stays exact either way (docs/exactness.md, "Token-level
verification": one-hot drafts).
"""

from dataclasses import dataclass, replace

from tandem.math.params import SamplingParams
from tandem.services import draft_worker
from tandem.services.batching import Job
from tandem.services.draft_worker import DraftWorkerServicer
from tandem.services.ngram import Lookup, NgramRuntime, one_hot
from tandem.services.runtime import CacheMiss, ModelRuntime, Step


@dataclass(frozen=True)
class ModelStep(Step):
    """A step the draft model runs as well as the token list taking it."""


class HybridRuntime(NgramRuntime):
    """Each session's token list and the draft model's cache of it; a session evicted from the
    list is released from the model too."""

    def __init__(self, lookup: Lookup, model: ModelRuntime, max_tokens: int = 64 << 20) -> None:
        super().__init__(lookup, max_tokens)
        self.model = model
        self.device, self.forward_pass = model.device, model.forward_pass  # the Batcher's and the banner's
        self.info = replace(model.info, model=f"hybrid({lookup.name}, {model.info.model})")
        self._fed: dict[str, int] = {}  # session → leading tokens of its list the model's cache agrees with

    @property
    def cache_bytes(self) -> int:
        return super().cache_bytes + self.model.cache_bytes

    @property
    def token_bytes(self) -> int:
        return super().token_bytes + self.model.token_bytes

    def fed(self, session_id: str) -> int:
        """Leading tokens of the session's list that its model cache holds."""
        return min(self._fed.get(session_id, 0), self.model.held(session_id))

    def extend_batch(self, steps: list[Step]) -> list:
        """Every step crops and extends its session's list (→ the list, as NgramRuntime's); a
        ModelStep also runs through the model in one pass with the others (→ its logits)."""
        results = super().extend_batch(steps)
        runs = []  # (index, model step)
        for i, (step, result) in enumerate(zip(steps, results)):
            if isinstance(result, CacheMiss):
                continue
            self._fed[step.session_id] = min(self._fed.get(step.session_id, 0), step.cache_len)
            if isinstance(step, ModelStep):
                runs.append((i, step))
        if runs:
            for (i, step), out in zip(runs, self.model.extend_batch([step for _, step in runs])):
                results[i] = out
                if not isinstance(out, CacheMiss):
                    self._fed[step.session_id] = step.cache_len + len(step.tokens)
        return results

    def release(self, session_id: str) -> bool:
        self._fed.pop(session_id, None)
        held = self.model.release(session_id)
        return super().release(session_id) or held


def propose(session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
            runtime: HybridRuntime, widths: list[int] = (), rule: str = "rrsw", ahead: dict | None = None) -> Job:
    """The job that drafts γ tokens: up to γ by lookup when the context's suffix occurred
    before, else γ by the model after feeding it what its cache lacks (a tree of these widths
    when they branch) → a Proposal. Raises CacheMiss. The list ends holding the context, and
    the block's drafts but the last after a chain. rule: a sampled tree's (propose_tree); ahead:
    a draft past a block under verification, its outcomes (draft_worker.propose_ahead's
    keywords; a lookup answers one chain, its first token the bonus's guess)."""
    context = yield Step(session_id, cache_len, tokens)
    drafted = runtime.lookup.propose(context, gamma)
    if drafted:
        if len(drafted) > 1:
            yield Step(session_id, len(context), drafted[:-1])
        return one_hot(drafted, params)
    # Feed one token at least, its logits draft (past rejections: the block and the token before it).
    rows = 1 + (ahead["block"] if ahead and ahead["rejections"] else 0)
    fed = min(runtime.fed(session_id), len(context) - rows)
    if draft_worker.is_tree(widths):
        return (yield from draft_worker.propose_tree(session_id, fed, context[fed:], widths, params, step=ModelStep,
                                                     rule=rule))
    if ahead:
        return (yield from draft_worker.propose_ahead(session_id, fed, context[fed:], gamma, params, **ahead,
                                                      step=ModelStep))
    return (yield from draft_worker.propose(session_id, fed, context[fed:], gamma, params, step=ModelStep))


class HybridDraftServicer(DraftWorkerServicer):
    """The DraftWorker service answered by lookup or by the model."""

    def draft(self, request, params: SamplingParams) -> tuple[Job, int]:
        widths = list(request.tree_widths)
        job = propose(request.session_id, request.cache_len, list(request.tokens), request.gamma, params,
                      self.runtime, widths, draft_worker.tree_rule(request),
                      draft_worker.ahead(request) if request.ahead else None)
        return job, self.returned_probs(request, params)


add_to_server = HybridDraftServicer.add_to_server
