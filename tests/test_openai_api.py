"""The OpenAI-compatible HTTP API against the running cluster, through the real `openai`
client (and raw HTTP where the client hides what is checked): the same tokens as the gRPC
SDK, streams, usage, speculative-decoding metrics, errors in OpenAI's shape, the bearer token,
the session cap, stop strings, a dropped stream's session, a resumed stream."""

import asyncio
import json
import time
from dataclasses import replace

import httpx2 as httpx
import openai
import pytest
from transformers import AutoTokenizer

import tandem
from tandem.orchestrator.config import api_key_digest

pytestmark = pytest.mark.cluster

API_KEY = "http-s3cret"
GUARDED = "guarded"  # a second application: a bearer token and one session at a time
PROMPT = "def fib(n):"
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "import os"}]


@pytest.fixture(scope="module")
def api(cluster) -> openai.OpenAI:
    with openai.OpenAI(base_url=cluster["base_url"], api_key="unused", timeout=120, max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(cluster):
    with tandem.Client(cluster["address"], timeout_s=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(api) -> str:
    return api.models.list().data[0].id


@pytest.fixture(scope="module")
def guarded(cluster):
    """The same workers behind an application with a token and max_sessions=1."""
    from tandem.orchestrator.app import start_ingress

    config = replace(cluster["config"], app_name=GUARDED, api_key_sha256=api_key_digest(API_KEY), max_sessions=1,
                     metrics_port=0)
    start_ingress(config, cluster["port"])
    yield f"http://127.0.0.1:{cluster['http_port']}/{GUARDED}/v1"
    from ray import serve

    serve.delete(GUARDED)


def _stream_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join(c.choices[0].text if hasattr(c.choices[0], "text") else (c.choices[0].delta.content or "")
                   for c in chunks if c.choices)
    return text, chunks


# --- the same tokens as the gRPC SDK ---------------------------------------------------------


def test_greedy_completion_is_the_sdks(api, sdk, model):
    expected = sdk.generate(PROMPT, max_tokens=24, temperature=0)
    got = api.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0)
    assert got.choices[0].text == expected.text
    assert got.usage.completion_tokens == len(expected.token_ids)
    assert got.choices[0].finish_reason == expected.finish_reason
    assert got.object == "text_completion" and got.id.startswith("cmpl-")


def test_greedy_chat_is_the_sdks_on_the_templated_prompt(api, sdk, model, pair):
    tokenizer = AutoTokenizer.from_pretrained(pair["target"])
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = sdk.generate(prompt_token_ids=list(ids), max_tokens=20, temperature=0)
    got = api.chat.completions.create(model=model, messages=MESSAGES, max_completion_tokens=20, temperature=0)
    assert got.choices[0].message.content == expected.text and got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == len(ids) and got.usage.completion_tokens == len(expected.token_ids)


def test_token_id_prompts_and_the_sampled_path_with_a_seed(api, sdk, model, pair):
    prompt = pair["prompts"][0]
    expected = sdk.generate(prompt_token_ids=prompt, max_tokens=16, temperature=0.8, seed=7, gamma=3)
    got = api.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0.8, seed=7,
                                 extra_body={"gamma": 3})
    assert got.choices[0].text == expected.text and got.usage.prompt_tokens == len(prompt)


def test_streamed_chunks_concatenate_to_the_whole_answer(api, model):
    whole = api.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0)
    text, chunks = _stream_text(api.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                                       stream=True, stream_options={"include_usage": True}))
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1

    chat = api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=20, temperature=0)
    text, chunks = _stream_text(api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=20,
                                                            temperature=0, stream=True))
    assert text == chat.choices[0].message.content and chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


# --- speculative-decoding metrics ----------------------------------------------------------


def _identities(spec: dict, sgl: dict, completion_tokens: int) -> None:
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"] > 0
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"]
                                                           / spec["num_spec_steps"])
    assert spec["draft_acceptance_rate"] == pytest.approx(spec["num_accepted_draft_tokens"]
                                                          / spec["num_draft_tokens"])
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]
    assert len(spec["acceptance_histogram"]) == spec["num_spec_tokens"] + 1
    for gamma, histogram in spec["acceptance_histogram_by_draft_length"].items():
        assert len(histogram) == int(gamma) + 1
    assert sum(map(sum, spec["acceptance_histogram_by_draft_length"].values())) == spec["num_spec_steps"]
    assert sum(sgl["spec_correct_drafts_histogram"]) == sgl["spec_verify_ct"]
    assert sum(i * n for i, n in enumerate(sgl["spec_correct_drafts_histogram"])) == sgl["spec_num_correct_drafts"]
    assert sgl["spec_accept_length"] == pytest.approx(completion_tokens / sgl["spec_verify_ct"])
    assert sgl["spec_num_correct_drafts"] == spec["num_accepted_draft_tokens"]


def test_metrics_follow_their_identities(api, model):
    extra = {"gamma": 4, "return_spec_tokens_details": True}
    whole = api.completions.create(model=model, prompt=PROMPT, max_tokens=32, temperature=0, extra_body=extra)
    spec = whole.model_extra["metrics"]["speculative_decoding"]
    _identities(spec, whole.model_extra["sglext"]["spec_tokens_details"], whole.usage.completion_tokens)
    assert spec["num_draft_tokens"] == 4 * spec["num_spec_steps"]

    chunks = list(api.completions.create(model=model, prompt=PROMPT, max_tokens=32, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body=extra))
    last = chunks[-1].model_extra
    assert last["metrics"]["speculative_decoding"] == spec
    _identities(last["metrics"]["speculative_decoding"], last["sglext"]["spec_tokens_details"],
                chunks[-1].usage.completion_tokens)
    plain = api.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert "sglext" not in (plain.model_extra or {})


def test_models_health_and_vllms_counters(cluster, api, model):
    card = api.models.list().data[0]
    assert card.model_extra["root"] == model and card.model_extra["max_model_len"] > 0
    base = f"http://127.0.0.1:{cluster['http_port']}"
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    api.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"gamma": 2})
    lines = httpx.get(f"{base}/metrics", timeout=30).text.splitlines()
    names = {line.split("{")[0] for line in lines if line.startswith("vllm:")}
    assert {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total"} <= names
    assert any(f'model_name="{model}"' in line for line in lines if line.startswith("vllm:spec_decode_num_drafts"))


# --- stop strings and ignore_eos -----------------------------------------------------------


def test_a_stop_string_cuts_the_answer_where_it_begins(api, model):
    full = api.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), full
    cut = full[:full.index(stop)]
    got = api.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "@@never@@"])
    assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
    assert got.usage.completion_tokens < 40
    text, chunks = _stream_text(api.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0,
                                                       stop=stop, stream=True))
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens(api, model, pair):
    for prompt in pair["prompts"]:
        answer = api.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
        if answer.choices[0].finish_reason == "stop":  # a prompt whose greedy answer hits EOS
            break
    else:
        pytest.fail("no prompt of the pair ends at EOS")
    longer = api.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert longer.choices[0].finish_reason == "length" and longer.usage.completion_tokens == 24


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"min_p": 0.1}, "min_p"), ({"logprobs": 2}, "logprobs"), ({"n": 2}, "n"), ({"echo": True}, "echo"),
    ({"best_of": 3}, "best_of"), ({"presence_penalty": -1}, "presence_penalty"), ({"typo_param": 1}, "typo_param"),
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -5}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**6}, "max_tokens"), ({"seed": -1}, "seed"),
    ({"gamma": 99}, "gamma"), ({"verification": "bogus"}, "verification"), ({"stop": [1]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"), ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [10**6]}, "prompt[0]"), ({"prompt": ""}, "prompt"), ({"stream": "yes"}, "stream"),
])
def test_each_bad_parameter_is_a_400_naming_it(cluster, model, body, param):
    answer = httpx.post(f"{cluster['base_url']}/completions", json={"model": model, "prompt": PROMPT} | body,
                        timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param.split("[")[0] in \
        error["message"]


def test_errors_come_in_openais_shape(cluster, api, model):
    base = cluster["base_url"]
    with pytest.raises(openai.NotFoundError) as e:
        api.completions.create(model="not-" + model, prompt=PROMPT, max_tokens=4)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=model, messages=[], max_tokens=4)
    assert e.value.body["param"] == "messages"
    for answer, status in ((httpx.post(f"{base}/completions", content=b"{not json", timeout=30), 400),
                           (httpx.get(f"{base}/nowhere", timeout=30), 404),
                           (httpx.post(f"{base}/completions", content=b" " * (5 << 20), timeout=60), 413)):
        assert answer.status_code == status and set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_the_bearer_token_and_the_session_cap(guarded, model):
    with openai.OpenAI(base_url=guarded, api_key="wrong", max_retries=0, timeout=60) as wrong:
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.completions.create(model=model, prompt=PROMPT, max_tokens=4)
        assert e.value.body["code"] == "invalid_api_key"
    assert httpx.post(f"{guarded}/completions", json={"prompt": PROMPT}, timeout=30).status_code == 401
    with openai.OpenAI(base_url=guarded, api_key=API_KEY, max_retries=0, timeout=120) as client:
        assert client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0).choices
        held = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True, "gamma": 0})
        next(iter(held))  # the one session slot is taken while this stream runs
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=4)
        assert e.value.response.headers["retry-after"] and e.value.body["type"] == "rate_limit_error"
        held.close()  # the client drops the stream: its session and its slot are freed
        deadline = time.monotonic() + 60
        while True:
            try:
                client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline, "the dropped stream's slot was never freed"
                time.sleep(0.2)


def test_a_dropped_stream_is_recorded_abandoned_and_resumes(cluster, api, model, redis_url):
    from tandem.orchestrator.store import read_session

    body = {"model": model, "prompt": PROMPT, "max_tokens": 60, "temperature": 0, "stream": True,
            "ignore_eos": True, "gamma": 0, "stop": ["\n\n\n\n\n\n"]}
    whole = api.completions.create(model=model, prompt=PROMPT, max_tokens=60, temperature=0,
                                   extra_body={"ignore_eos": True}, stop=["\n\n\n\n\n\n"]).choices[0].text
    url = f"{cluster['base_url']}/completions"
    texts = []
    with httpx.stream("POST", url, json=body, timeout=60) as answer:
        session_id = answer.headers["x-tandem-session-id"]
        for line in answer.iter_lines():
            assert not line or line.startswith("data: ")  # lone data lines, as the field's parsers read them
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                texts.append(chunk["choices"][0]["text"])
                if len(texts) == 3:
                    break
    resume_index = str(chunk["resume_index"])
    deadline = time.monotonic() + 60
    while asyncio.run(read_session(redis_url, session_id)).status != "abandoned":
        assert time.monotonic() < deadline, "the dropped stream's session was not recorded abandoned"
        time.sleep(0.2)
    with httpx.stream("POST", url, json=body, timeout=60,
                      headers={"x-tandem-session-id": session_id, "x-tandem-resume-index": resume_index}) as answer:
        assert answer.status_code == 200 and answer.headers["x-tandem-session-id"] == session_id
        texts += [json.loads(line[6:])["choices"][0]["text"] for line in answer.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(texts) == whole
    other = httpx.post(url, json=body | {"prompt": "import os"}, timeout=60,
                       headers={"x-tandem-session-id": session_id})
    assert other.status_code == 400 and other.json()["error"]["param"] == "prompt"
    unknown = httpx.post(url, json=body, timeout=60, headers={"x-tandem-session-id": "f" * 32})
    assert unknown.status_code == 404
