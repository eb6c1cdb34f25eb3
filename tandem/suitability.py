"""Is a draft/target pair worth deploying? Measure it before a cluster runs it.

The field's rules of thumb, checked with numbers: the two models must speak one vocabulary
(tandem sends token ids, never text, between them: a draft whose tokenizer differs drafts the
tokens the two share, under the target's ids, tandem.services.vocabulary); a draft token should
cost well under 15% of a target token; and what the draft proposes must be accepted often enough
that the analytic speedup S(α, γ, cost) = E[tokens | α, γ] / (1 + γ·cost) clears 1 with room to
spare.

Acceptance is measured the way the cluster experiences it: along the target's own greedy
continuation of each prompt, at every position,
  greedy agreement   = P(argmax draft_probs == argmax target_probs)   (α for temperature 0)
  sampled acceptance = E[Σ_v min(draft_probs(v), target_probs(v))]    (α for temperature 1)
with a draft of another tokenizer reading the context as it serves it (each target token's
spelling) and its distributions restricted to the shared tokens. Such a pair's report also says
how much of the target's continuation the shared tokens cover: greedy agreement's ceiling.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from tandem.math.analytic import analytic_speedup, best_gamma
from tandem.services.runtime import cache_argument, eos_token_ids
from tandem.services.vocabulary import PairMismatch, VocabularyMap, between, has_tokenizer, tokenizer_of

COST_RULE = 0.15  # draft/target cost per token, the usual ceiling for a useful draft
SUITABLE_SPEEDUP = 1.3


@dataclass
class PairReport:
    draft: str
    target: str
    vocab_size: int
    prompts: int
    positions: int  # scored continuation tokens, over all prompts
    draft_ms: float  # per token, one decode step with a KV cache
    target_ms: float
    greedy_agreement: float
    sampled_acceptance: float
    max_gamma: int
    gamma: int = 0  # best γ for greedy requests
    speedup: float = 1.0  # analytic, greedy
    gamma_sampled: int = 0
    speedup_sampled: float = 1.0
    verdict: str = ""
    problems: list[str] = field(default_factory=list)
    shared_tokens: int | None = None  # a draft of another tokenizer: the tokens the two share
    shared_of_draft: float | None = None
    shared_of_target: float | None = None
    coverage: float | None = None  # of the target's continuation tokens, those the shared tokens hold

    @property
    def cost_ratio(self) -> float:
        """Draft cost per token as a fraction of the target's."""
        return self.draft_ms / self.target_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "cost_ratio": self.cost_ratio}

    def summary(self) -> str:
        return "\n".join([
            f"draft   {self.draft}",
            f"target  {self.target}",
            self._vocabulary_line(),
            f"cost per token      draft {self.draft_ms:.2f} ms, target {self.target_ms:.2f} ms: "
            f"ratio {self.cost_ratio:.3f} (rule of thumb: under {COST_RULE})",
            f"acceptance          greedy agreement {self.greedy_agreement:.3f}, T=1 acceptance "
            f"{self.sampled_acceptance:.3f} ({self.positions} positions over {self.prompts} prompts)",
            f"analytic speedup    greedy {self.speedup:.2f}x at gamma {self.gamma}; T=1 {self.speedup_sampled:.2f}x "
            f"at gamma {self.gamma_sampled} (gamma <= {self.max_gamma})",
            *(f"problem             {p}" for p in self.problems),
            f"verdict             {self.verdict}",
        ])


    def _vocabulary_line(self) -> str:
        if self.shared_tokens is None:
            return f"vocabulary          shared, {self.vocab_size} tokens"
        return (f"vocabulary          mapped: {self.shared_tokens} tokens shared ({self.shared_of_draft:.1%} of the "
                f"draft's, {self.shared_of_target:.1%} of the target's); they hold {self.coverage:.1%} of the "
                f"target's continuation tokens")


def check_vocabulary(draft_dir: str, target_dir: str) -> VocabularyMap | None:
    """The map a draft of another tokenizer needs (None: the two share one vocabulary), or
    PairMismatch saying how the two differ: too little shared, or, without both tokenizers to
    tell, different sizes."""
    if not (has_tokenizer(draft_dir) and has_tokenizer(target_dir)):
        sizes = {name: AutoConfig.from_pretrained(d).vocab_size for name, d in (("draft", draft_dir),
                                                                               ("target", target_dir))}
        if sizes["draft"] != sizes["target"]:
            raise PairMismatch(f"draft and target vocabularies differ: the draft has {sizes['draft']} tokens, "
                               f"the target {sizes['target']}, and without both tokenizers tandem cannot map one "
                               "to the other")
        return None
    return between(draft_dir, target_dir)


def draft_logits(draft, vocabulary: VocabularyMap | None, tokens: list[int], scored: slice) -> torch.Tensor:
    """The draft's logits after each of tokens[scored] as the cluster serves it (a draft of
    another tokenizer reading the tokens spelled in its own) → [n, target vocab]."""
    if vocabulary is None:
        return draft(input_ids=torch.tensor([tokens])).logits[0, scored]
    ids, ends = vocabulary.spell(tokens)
    logits = draft(input_ids=torch.tensor([ids])).logits[0]
    return vocabulary.target_logits(logits[[e - 1 for e in ends[scored]]])


@torch.inference_mode()
def _decode_times(model, context: list[int], steps: int) -> list[float]:
    """Wall seconds of `steps` decode steps with a KV cache, after prefilling `context`."""
    cache = {cache_argument(model): DynamicCache(config=model.config)}
    token = model(input_ids=torch.tensor([context]), use_cache=True, **cache).logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        token = model(input_ids=token, use_cache=True, **cache).logits[:, -1:].argmax(-1)  # [1, 1]
        times.append(time.perf_counter() - start)
    return times


def cost_per_token_ms(models: list, context: list[int], draft_ids=None, rounds: int = 7,
                      steps: int = 16) -> list[float]:
    """Median milliseconds per decode step for each model, the models taking turns for
    `rounds` rounds so that a noisy machine slows them alike. draft_ids: the first model's
    reading of the context (a draft of another tokenizer's spelling)."""
    times: list[list[float]] = [[] for _ in models]
    contexts = [draft_ids(context) if draft_ids else context] + [context] * (len(models) - 1)
    for _ in range(rounds):
        for model, ids, acc in zip(models, contexts, times):
            acc += _decode_times(model, ids, steps)[1:]  # the first step warms up
    return [statistics.median(t) * 1e3 for t in times]


@torch.inference_mode()
def greedy_continuation(model, prompt: list[int], max_new_tokens: int, eos: tuple[int, ...]) -> list[int]:
    cache = {cache_argument(model): DynamicCache(config=model.config)}
    ids, out = torch.tensor([prompt]), []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=ids, use_cache=True, **cache).logits[0, -1].argmax())
        out.append(token)
        if token in eos:
            break
        ids = torch.tensor([[token]])
    return out


@torch.inference_mode()
def acceptance(draft, target, prompt: list[int], continuation: list[int],
               vocabulary: VocabularyMap | None = None) -> tuple[int, float, int]:
    """(argmax agreements, Σ over positions of Σ_v min(draft_probs, target_probs), positions);
    vocabulary: a draft of another tokenizer's map."""
    tokens = prompt + continuation[:-1]
    scored = slice(len(prompt) - 1, None)
    draft_probs = torch.softmax(draft_logits(draft, vocabulary, tokens, scored).double(), -1)  # [n, vocab]
    target_probs = torch.softmax(target(input_ids=torch.tensor([tokens])).logits[0, scored].double(), -1)  # [n, vocab]
    agree = int((draft_probs.argmax(-1) == target_probs.argmax(-1)).sum())
    return agree, float(torch.minimum(draft_probs, target_probs).sum()), len(continuation)


def verdict(report: PairReport) -> PairReport:
    if report.cost_ratio > COST_RULE:
        report.problems.append(f"a draft token costs {report.cost_ratio:.2f} of a target token (rule of thumb: "
                               f"under {COST_RULE}); the draft spends much of what it saves")
    if report.speedup <= 1.0:
        report.verdict = "unsuitable: the target alone is faster than any gamma"
    elif report.speedup >= SUITABLE_SPEEDUP and not report.problems:
        report.verdict = f"suitable: expect about {report.speedup:.2f}x over the target alone (greedy)"
    else:
        report.verdict = f"marginal: at most {report.speedup:.2f}x over the target alone (greedy)"
    return report


def check_pair(draft_dir: str, target_dir: str, prompts: list[str] | list[list[int]], max_new_tokens: int = 64,
               max_gamma: int = 8, threads: int = 1) -> PairReport:
    """Measure the pair on `prompts` (text, or token ids when neither model has a tokenizer)."""
    vocabulary = check_vocabulary(draft_dir, target_dir)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # one thread each, as `tandem up` runs the workers here
    try:
        draft, target = (AutoModelForCausalLM.from_pretrained(d).eval() for d in (draft_dir, target_dir))
        tokenizer = tokenizer_of(target_dir) or tokenizer_of(draft_dir)
        if prompts and isinstance(prompts[0], str):
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer, and neither model directory has one")
            prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        eos = eos_token_ids(target.generation_config) or eos_token_ids(target.config)
        agree, mass, positions, covered = 0, 0.0, 0, 0
        shared = set(vocabulary.target_of.values()) if vocabulary else None
        for prompt in prompts:
            continuation = greedy_continuation(target, prompt, max_new_tokens, eos)
            a, m, n = acceptance(draft, target, prompt, continuation, vocabulary)
            agree, mass, positions = agree + a, mass + m, positions + n
            covered += sum(t in shared for t in continuation) if shared else n
        draft_ms, target_ms = cost_per_token_ms([draft, target], prompts[0],
                                                None if vocabulary is None else lambda tokens: vocabulary.spell(tokens)[0])
        report = PairReport(draft=draft_dir, target=target_dir, vocab_size=int(target.config.vocab_size),
                            prompts=len(prompts), positions=positions, draft_ms=draft_ms, target_ms=target_ms,
                            greedy_agreement=agree / positions,
                            sampled_acceptance=mass / positions, max_gamma=max_gamma)
        if vocabulary:
            overlap = vocabulary.overlap
            report.shared_tokens, report.coverage = overlap.shared, covered / positions
            report.shared_of_draft, report.shared_of_target = overlap.shared / overlap.draft, overlap.shared / overlap.target
    finally:
        torch.set_num_threads(previous_threads)
    inverse_cost = 1.0 / report.cost_ratio  # analytic_speedup takes target cost / draft cost
    report.gamma = best_gamma(report.greedy_agreement, inverse_cost, max_gamma)
    report.speedup = analytic_speedup(report.greedy_agreement, report.gamma, inverse_cost)
    report.gamma_sampled = best_gamma(report.sampled_acceptance, inverse_cost, max_gamma)
    report.speedup_sampled = analytic_speedup(report.sampled_acceptance, report.gamma_sampled, inverse_cost)
    return verdict(report)
