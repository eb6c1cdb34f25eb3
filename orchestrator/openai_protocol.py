"""The OpenAI API's request and response shapes for the HTTP ingress: a request body becomes a
tandem GenerationRequest and its OpenAI-only options, or a FieldError naming the field; a
generation's text, counts and cycles become OpenAI's objects, with speculative-decoding
metrics in vLLM's (`metrics.speculative_decoding`) and SGLang's (`sglext.spec_tokens_details`)
schemas.

No parameter that would change the output is ignored: each one is either honoured, accepted
at its neutral value only, or refused with a 400 naming it; so is any parameter not known here.
Pure Python: no HTTP, no Ray.
"""

import json
import re
import time
from dataclasses import dataclass, field

from tandem.wire.generation import DRAFT_SHAPES, TREE_RULES, VERIFICATION_MODES, CycleStats, GenerationRequest
from tandem.wire.validation import FieldError, invalid

COMPLETION, CHAT = "text_completion", "chat.completion"
MAX_STOPS = 4  # OpenAI's limit on `stop` strings
MAX_STOP_CHARS = 256

# Honoured by both endpoints (tandem's own knobs are extensions, as vLLM's `top_k` is).
_SHARED = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
           "gamma", "verification", "draft_shape", "tree_rule", "return_spec_tokens_details", "ignore_eos"}
_HONOURED = {COMPLETION: _SHARED | {"prompt"}, CHAT: _SHARED | {"messages", "max_completion_tokens"}}
# Accepted and without effect on the output.
_INERT = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
# Known parameters that would change the output: accepted at their neutral value only.
_NEUTRAL = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,), "length_penalty": (1,),
    "logit_bias": ({},), "min_p": (0,), "min_tokens": (0,), "stop_token_ids": ([],), "best_of": (1,),
    "echo": (False,), "suffix": ("",), "logprobs": (False, 0), "top_logprobs": (0,), "prompt_logprobs": (0,),
    "skip_special_tokens": (True,), "include_stop_str_in_output": (False,), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "add_generation_prompt": (True,), "continue_final_message": (False,), "prediction": (),
    "modalities": (["text"],), "audio": (), "reasoning_effort": (), "web_search_options": (),
}
_WHY = {"logprobs": "log probabilities are not returned yet", "top_logprobs": "log probabilities are not returned yet",
        "echo": "the prompt is not echoed", "best_of": "one sequence per request", "n": "one choice per request"}


@dataclass
class ApiRequest:
    """A parsed request: what tandem generates, and how the answer is shaped."""

    kind: str  # COMPLETION or CHAT
    generation: GenerationRequest
    messages: list[dict] = field(default_factory=list)  # CHAT: rendered by the tokenizer's chat template
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    spec_details: bool = False  # SGLang's return_spec_tokens_details
    max_tokens_field: str = "max_tokens"  # as the request named it (chat: max_completion_tokens)


def parse(body: object, kind: str) -> ApiRequest:
    """The request body (decoded JSON) → an ApiRequest; FieldError (INVALID_ARGUMENT) names the field."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    given = {k: v for k, v in body.items() if v is not None}
    for name, value in given.items():
        _check_known(name, value, kind)
    g = GenerationRequest(
        temperature=_number(given, "temperature"), top_p=_number(given, "top_p"), top_k=_top_k(given),
        seed=_int(given, "seed", 0), gamma=_gamma(given),
        verification=_choice(given, "verification", VERIFICATION_MODES),
        draft_shape=_choice(given, "draft_shape", DRAFT_SHAPES), ignore_eos=_bool(given, "ignore_eos"),
        tree_rule=_choice(given, "tree_rule", TREE_RULES))
    req = ApiRequest(kind, g, model=_string(given, "model"), stream=_bool(given, "stream"),
                     stop=_stops(given), spec_details=_bool(given, "return_spec_tokens_details"))
    req.include_usage = _include_usage(given, req.stream)
    if kind == CHAT and "max_completion_tokens" in given:
        req.max_tokens_field = "max_completion_tokens"
    g.max_tokens = _int(given, req.max_tokens_field, 1, 2**32) or 0
    if kind == COMPLETION:
        _prompt(given, g)
    else:
        req.messages = _messages(given)
    return req


def _check_known(name: str, value, kind: str) -> None:
    if name in _HONOURED[kind] or name in _INERT:
        if name == "n" and (value != 1 or isinstance(value, bool)):
            raise invalid("n", f"only n=1 is supported ({_WHY['n']}), got {value!r}")
        return
    if name in _NEUTRAL:
        neutral = _NEUTRAL[name]
        # Equal to a neutral value; a boolean only to a boolean (false is not a penalty of 0).
        if any(value == v and type(value) is not bool or value is v for v in neutral):
            return
        why = _WHY.get(name, "tandem does not support it")
        shown = f"{json.dumps(neutral[0])} or null" if neutral else "null"
        raise invalid(name, f"{why}: only {shown} is accepted, got {json.dumps(value)[:80]}")
    raise invalid(name, "unknown parameter (tandem refuses parameters it would otherwise ignore)")


def _bool(given: dict, name: str) -> bool:
    value = given.get(name, False)
    if not isinstance(value, bool):
        raise invalid(name, f"must be a boolean, got {json.dumps(value)[:40]}")
    return value


def _string(given: dict, name: str) -> str | None:
    value = given.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(name, "must be a string")
    return value


def _number(given: dict, name: str) -> float | None:
    value = given.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"must be a number, got {json.dumps(value)[:40]}")
    return float(value)


def _int(given: dict, name: str, minimum: int, limit: int = 2**64) -> int | None:
    value = given.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"must be an integer, got {json.dumps(value)[:40]}")
    if value < minimum:
        raise invalid(name, f"must be >= {minimum}, got {value}")
    if value >= limit:
        raise invalid(name, f"must be below {limit}, got {value}")
    return value


def _top_k(given: dict) -> int | None:
    value = given.get("top_k")
    if value == -1:  # vLLM's "all tokens"
        return 0
    return _int(given, "top_k", 0, 2**31)


def _gamma(given: dict) -> int | None:
    if given.get("gamma") == "auto":
        return None
    return _int(given, "gamma", 0, 2**31)


def _choice(given: dict, name: str, choices: tuple[str, ...]) -> str:
    value = given.get(name, "")
    if value != "" and value not in choices:
        raise invalid(name, f"must be one of {', '.join(choices)}, got {json.dumps(value)[:40]}")
    return value


def _stops(given: dict) -> tuple[str, ...]:
    value = given.get("stop", [])
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid("stop", f"at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    return tuple(s for s in stops if s)


def _include_usage(given: dict, stream: bool) -> bool:
    options = given.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "only allowed with stream: true")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise invalid("stream_options", "an object with include_usage")
    if options.get("continuous_usage_stats"):
        raise invalid("stream_options.continuous_usage_stats", "usage comes once, on the last chunk")
    return _bool(options, "include_usage")


def _prompt(given: dict, g: GenerationRequest) -> None:
    prompt = given.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        g.prompt = prompt
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        g.prompt_token_ids = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid("prompt", f"one prompt per request, got {len(prompt)}")
    else:
        raise invalid("prompt", "a string, a list of token ids, or a list holding one of them")


def _messages(given: dict) -> list[dict]:
    messages = given.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "a non-empty list of messages is required")
    rendered = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid(f"messages[{i}]", "an object with a role and content")
        unknown = set(m) - {"role", "content", "name"}
        if unknown:
            raise invalid(f"messages[{i}].{sorted(unknown)[0]}", "not supported (text messages only)")
        rendered.append({"role": m["role"], "content": _text(m.get("content"), f"messages[{i}].content")})
    return rendered


def _text(content, name: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        for j, part in enumerate(content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{name}[{j}]", "only text parts are supported")
        return "".join(p["text"] for p in content)
    raise invalid(name, "a string or a list of text parts")


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat's prompt as token ids, through the tokenizer's own chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise invalid("messages", "this model's tokenizer has no chat template: use /v1/completions with a prompt")
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception as e:  # a template that raises on these messages (e.g. roles out of order)
        raise invalid("messages", f"the chat template refused them: {e}") from None
    return list(ids)


def field_name(e: FieldError, req: ApiRequest | None) -> str:
    """The OpenAI request's name for the field a FieldError names (tandem's gRPC names)."""
    head, rest = re.match(r"([A-Za-z_]*)(.*)", e.field).groups()
    if req is not None:
        prompt = "messages" if req.kind == CHAT else "prompt"
        head = {"prompt_token_ids": prompt, "prompt": prompt, "max_tokens": req.max_tokens_field}.get(head, head)
        if head == "messages":
            rest = ""
    return head + rest


# --- responses ---------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_decoding(per_cycle: list[CycleStats], num_spec_tokens: int) -> dict:
    """vLLM's per-request `metrics.speculative_decoding`: verify steps that drafted (γ > 0),
    their drafted and accepted tokens, and a histogram of accepted counts. Σ histogram =
    num_spec_steps; mean_acceptance_length = 1 + accepted / steps. tandem's γ varies by cycle:
    acceptance_histogram_by_draft_length has one histogram per γ used (as vLLM's main)."""
    steps = [c for c in per_cycle if c.gamma]
    drafted = sum(c.gamma for c in steps)
    accepted = sum(c.accepted for c in steps)
    histogram = [0] * (num_spec_tokens + 1)
    by_length: dict[str, list[int]] = {}
    for c in steps:
        histogram[min(c.accepted, num_spec_tokens)] += 1
        by_length.setdefault(str(c.gamma), [0] * (c.gamma + 1))[min(c.accepted, c.gamma)] += 1
    return {"mean_acceptance_length": 1 + accepted / len(steps) if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": histogram,
            "acceptance_histogram_by_draft_length": dict(sorted(by_length.items(), key=lambda kv: int(kv[0]))),
            "num_spec_steps": len(steps), "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
            "num_spec_tokens": num_spec_tokens}


def spec_tokens_details(per_cycle: list[CycleStats], completion_tokens: int) -> dict:
    """SGLang's `sglext.spec_tokens_details`: every verify round counts (a γ = 0 cycle is a round
    with nothing drafted). Σ histogram = spec_verify_ct; Σ i·histogram[i] = spec_num_correct_drafts;
    spec_accept_length = completion_tokens / spec_verify_ct."""
    rounds = len(per_cycle)
    correct = sum(c.accepted for c in per_cycle)
    proposed = sum(c.gamma for c in per_cycle)
    histogram = [0] * (max((c.accepted for c in per_cycle), default=0) + 1)
    for c in per_cycle:
        histogram[c.accepted] += 1
    return {"spec_accept_rate": correct / proposed if proposed else 0.0,
            "spec_accept_length": completion_tokens / rounds if rounds else 0.0,
            "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed, "spec_verify_ct": rounds,
            "spec_correct_drafts_histogram": histogram}


class Shaper:
    """One response's objects: the same id, creation time and model on every chunk."""

    def __init__(self, req: ApiRequest, session_id: str, model: str, num_spec_tokens: int) -> None:
        self.req, self.model, self.num_spec_tokens = req, model, num_spec_tokens
        self.id = ("chatcmpl-" if req.kind == CHAT else "cmpl-") + session_id
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if req.kind == CHAT and req.stream else req.kind

    def _head(self) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model}

    def choice(self, text: str, finish_reason: str | None, first: bool = False) -> dict:
        if self.req.kind == COMPLETION:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if not self.req.stream:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish_reason}
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None, first: bool = False, resume_index: int = 0) -> dict:
        """A stream's chunk; resume_index: the tokens delivered with it (tandem's resumable streams)."""
        body = self._head() | {"choices": [self.choice(text, finish_reason, first)], "resume_index": resume_index}
        if self.req.include_usage:
            body["usage"] = None
        return body

    def extras(self, prompt_tokens: int, completion_tokens: int, per_cycle: list[CycleStats]) -> dict:
        """usage, metrics and (asked for) sglext: the last stream chunk's, or a whole response's."""
        body = {"usage": usage(prompt_tokens, completion_tokens),
                "metrics": {"speculative_decoding": spec_decoding(per_cycle, self.num_spec_tokens)}}
        if self.req.spec_details:
            body["sglext"] = {"spec_tokens_details": spec_tokens_details(per_cycle, completion_tokens)}
        return body

    def last(self, prompt_tokens: int, completion_tokens: int, per_cycle: list[CycleStats]) -> dict:
        """The stream's usage chunk: no choices (OpenAI's include_usage)."""
        return self._head() | {"choices": []} | self.extras(prompt_tokens, completion_tokens, per_cycle)

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
              per_cycle: list[CycleStats]) -> dict:
        return (self._head() | {"choices": [self.choice(text, finish_reason)]}
                | self.extras(prompt_tokens, completion_tokens, per_cycle))


def error(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def model_card(name: str, max_model_len: int, created: int) -> dict:
    """One entry of /v1/models; `root` and `max_model_len` as vLLM gives them (benchmark tools read root)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "tandem", "root": name, "parent": None,
            "max_model_len": max_model_len}
