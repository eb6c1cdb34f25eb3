"""The ingress's bearer-token check, as pure logic (the whole path: tests/test_security.py)."""

import grpc
import pytest

from tandem.orchestrator.auth import authorize
from tandem.orchestrator.config import api_key_digest
from tandem.wire.validation import FieldError

DIGEST = api_key_digest("s3cret")


@pytest.mark.parametrize("metadata", [
    (("authorization", "Bearer s3cret"),),
    (("Authorization", "bearer s3cret"),),
    (("application", "tandem"), ("authorization", "  Bearer   s3cret ")),
])
def test_the_right_token_passes(metadata):
    authorize(metadata, DIGEST)


@pytest.mark.parametrize("metadata,why", [
    ((), "missing"),
    (None, "missing"),
    ((("authorization", "s3cret"),), "expected 'Bearer <token>'"),
    ((("authorization", "Basic s3cret"),), "expected 'Bearer <token>'"),
    ((("authorization", "Bearer "),), "expected 'Bearer <token>'"),
    ((("authorization", "Bearer s3cre"),), "not valid"),
    ((("authorization", "Bearer s3cret2"),), "not valid"),
    ((("x-authorization", "Bearer s3cret"),), "missing"),
])
def test_anything_else_is_unauthenticated_naming_the_field(metadata, why):
    with pytest.raises(FieldError) as info:
        authorize(metadata, DIGEST)
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert str(info.value).startswith("authorization") and why in str(info.value)


def test_no_token_configured_lets_every_call_in():
    authorize((), None)
