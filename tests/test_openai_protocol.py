"""The OpenAI API's shapes without a cluster: request bodies to tandem requests (every refusal
names its field), stop strings held back and cut the same however the text is split, and the
speculative-decoding metrics' identities."""

import grpc
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tandem.orchestrator.openai_protocol import (CHAT, COMPLETION, chat_prompt_ids, field_name, parse,
                                                 spec_decoding, spec_tokens_details)
from tandem.orchestrator.stop_strings import StopStrings
from tandem.wire.generation import CycleStats
from tandem.wire.validation import FieldError


def test_a_completion_body_becomes_a_generation_request():
    req = parse({"model": "m", "prompt": ["def f():"], "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": -1,
                 "seed": 3, "stop": "\n", "stream": True, "stream_options": {"include_usage": True}, "gamma": "auto",
                 "verification": "token", "draft_shape": "tree", "ignore_eos": True, "user": "u",
                 "frequency_penalty": 0, "logprobs": None, "repetition_penalty": 1.0, "n": 1}, COMPLETION)
    g = req.generation
    assert (g.prompt, g.max_tokens, g.temperature, g.top_p, g.top_k, g.seed) == ("def f():", 7, 0.0, 0.5, 0, 3)
    assert (g.gamma, g.verification, g.draft_shape, g.ignore_eos) == (None, "token", "tree", True)
    assert req.stream and req.include_usage and req.stop == ("\n",) and req.model == "m"
    assert parse({"prompt": [5, 6, 7]}, COMPLETION).generation.prompt_token_ids == [5, 6, 7]


def test_a_chat_body_keeps_its_messages_and_its_max_tokens_name():
    req = parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                         "text": "b"}]}],
                 "max_completion_tokens": 5}, CHAT)
    assert req.messages == [{"role": "user", "content": "ab"}] and req.generation.max_tokens == 5
    assert req.max_tokens_field == "max_completion_tokens"
    e = FieldError(grpc.StatusCode.OUT_OF_RANGE, "max_tokens", "too many")
    assert field_name(e, req) == "max_completion_tokens"
    assert field_name(FieldError(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids[3]", "x"), req) == "messages"
    completion = parse({"prompt": "x"}, COMPLETION)
    assert field_name(FieldError(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids[3]", "x"), completion) == \
        "prompt[3]"


@pytest.mark.parametrize("body, kind, param", [
    ([1], COMPLETION, "body"), ({"prompt": 5}, COMPLETION, "prompt"), ({"messages": "hi"}, CHAT, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, CHAT, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, CHAT, "messages[0].tool_calls"),
    ({"prompt": "x", "max_completion_tokens": 3}, COMPLETION, "max_completion_tokens"),
    ({"prompt": "x", "stop": ["a"] * 5}, COMPLETION, "stop"), ({"prompt": "x", "top_k": 2**40}, COMPLETION, "top_k"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, COMPLETION, "response_format"),
    ({"prompt": "x", "tools": [{"type": "function"}]}, COMPLETION, "tools"),
    ({"prompt": "x", "skip_special_tokens": False}, COMPLETION, "skip_special_tokens"),
    ({"prompt": "x", "frequency_penalty": False}, COMPLETION, "frequency_penalty"),
    ({"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}, COMPLETION,
     "stream_options.continuous_usage_stats"),
])
def test_bad_bodies_name_their_field(body, kind, param):
    with pytest.raises(FieldError) as e:
        parse(body, kind)
    assert e.value.field == param and e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_tokenizer_without_a_chat_template_refuses_chat_clearly():
    class Plain:
        chat_template = None

    with pytest.raises(FieldError, match="no chat template") as e:
        chat_prompt_ids(Plain(), [{"role": "user", "content": "hi"}])
    assert e.value.field == "messages"


# --- stop strings ----------------------------------------------------------------------------


def _run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool, int]:
    matcher = StopStrings(stops)
    out = "".join(matcher.push(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces))
    return out, matcher.matched, matcher.end


def test_text_that_may_begin_a_stop_string_is_held_back():
    matcher = StopStrings(("STOP",))
    assert matcher.push("abcST") == "abc"
    assert matcher.push("O") == ""
    assert matcher.push("P tail") == "" and matcher.matched and matcher.end == 7
    matcher = StopStrings(("STOP",))
    assert matcher.push("xST") == "x" and matcher.push("ay") == "STay"
    assert StopStrings(("STOP",)).push("abST", final=True) == "abST"


@given(text=st.text(alphabet="abS", max_size=40), stops=st.lists(st.text(alphabet="abS", min_size=1, max_size=4),
                                                                 min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=6))
@example(text="SbS", stops=["b", "SbS"], cuts=[2])  # "b" completes first; "SbS" starts first
def test_what_is_released_does_not_depend_on_the_split(text, stops, cuts):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] or [""]
    out, matched, end = _run(tuple(stops), pieces)
    found = [(i, i + len(s)) for s in stops if (i := text.find(s)) >= 0]
    if found:
        cut, stop_end = min(found)
        assert (out, matched, end) == (text[:cut], True, stop_end)
    else:
        assert (out, matched) == (text, False)


# --- metrics ---------------------------------------------------------------------------------


def test_spec_metrics_identities_on_known_cycles():
    cycles = [CycleStats(gamma=4, accepted=4, output_tokens=5), CycleStats(gamma=4, accepted=1, output_tokens=2),
              CycleStats(gamma=0, accepted=0, output_tokens=1), CycleStats(gamma=2, accepted=0, output_tokens=1)]
    spec = spec_decoding(cycles, num_spec_tokens=8)
    assert spec["num_spec_steps"] == 3 and spec["num_draft_tokens"] == 10 and spec["num_accepted_draft_tokens"] == 5
    assert spec["acceptance_histogram"] == [1, 1, 0, 0, 1, 0, 0, 0, 0]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 5 / 3) and spec["draft_acceptance_rate"] == 0.5
    assert spec["acceptance_histogram_by_draft_length"] == {"2": [1, 0, 0], "4": [0, 1, 0, 0, 1]}
    sgl = spec_tokens_details(cycles, completion_tokens=9)
    assert sgl["spec_verify_ct"] == 4 and sgl["spec_correct_drafts_histogram"] == [2, 1, 0, 0, 1]
    assert sgl["spec_accept_length"] == 9 / 4 and sgl["spec_accept_rate"] == 0.5
    empty = spec_decoding([], num_spec_tokens=4)
    assert empty["mean_acceptance_length"] == 1.0 and empty["draft_acceptance_rate"] == 0.0
