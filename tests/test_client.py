"""The SDK's resume policy, without a server: what it asks for next, when a break is final,
and that only delivered tokens count as progress."""

import grpc
import pytest

import tandem
from tandem.sdk.client import _Follow
from tandem.v1 import generation_pb2, generation_pb2_grpc


class _Broken(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"broken: {self._code.name}"


def _chunk(tokens=(), session_id="sid", finish_reason=""):
    return generation_pb2.GenerateChunk(session_id=session_id, token_ids=list(tokens), finish_reason=finish_reason)


def _stub():
    return generation_pb2_grpc.GenerationStub(grpc.insecure_channel("127.0.0.1:1"))


def test_a_break_before_the_session_id_sends_the_request_again_after_it_resumes():
    stub = _stub()
    follow = _Follow(request=tandem.sdk.client.build_request(None, [5, 6], 8, 0.0, None, None, None, None),
                     session_id=None, received=0, timeout_s=60, attempts=3)
    method, request, _ = follow.call(stub)
    assert method is stub.GenerateStream and list(request.prompt_token_ids) == [5, 6]
    assert follow.chunk(_chunk()) is None  # the first chunk names the session, nothing for the caller
    assert follow.chunk(_chunk([7, 8])).token_ids == [7, 8]
    method, request, _ = follow.call(stub)
    assert method is stub.Resume and (request.session_id, request.from_index) == ("sid", 2)


def test_only_delivered_tokens_reset_the_count_of_breaks():
    follow = _Follow(None, "sid", 4, timeout_s=600, attempts=2)
    for _ in range(2):
        assert 0 < follow.pause_before_retry(_Broken(grpc.StatusCode.UNAVAILABLE)) <= 4.8
        assert follow.chunk(_chunk()) is None  # an empty replay: no progress
    with pytest.raises(tandem.UnavailableError):
        follow.pause_before_retry(_Broken(grpc.StatusCode.UNAVAILABLE))
    follow.chunk(_chunk([9]))  # tokens: a fresh count
    assert follow.pause_before_retry(_Broken(grpc.StatusCode.INTERNAL)) > 0
    assert follow.received == 5


@pytest.mark.parametrize("code, error", [
    (grpc.StatusCode.INVALID_ARGUMENT, tandem.InvalidArgumentError),
    (grpc.StatusCode.NOT_FOUND, tandem.NotFoundError),
    (grpc.StatusCode.ABORTED, tandem.AbortedError),  # another stream took the session over
    (grpc.StatusCode.DEADLINE_EXCEEDED, tandem.DeadlineExceededError),
])
def test_a_refusal_is_final(code, error):
    with pytest.raises(error):
        _Follow(None, "sid", 0, timeout_s=60, attempts=8).pause_before_retry(_Broken(code))


def test_no_resume_past_the_deadline():
    with pytest.raises(tandem.UnavailableError):
        _Follow(None, "sid", 0, timeout_s=0.01, attempts=8).pause_before_retry(_Broken(grpc.StatusCode.UNAVAILABLE))


def test_resume_arguments_are_checked_client_side():
    with tandem.Client("127.0.0.1:1") as client:
        for session_id, index in (("", 0), ("sid", -1), ("sid", 1.5), ("sid", True)):
            with pytest.raises(ValueError):
                client.resume(session_id, index)
