"""Field checks shared by every edge (workers and the orchestrator's ingress).

Each failure names its field and carries the gRPC status to answer with, so that a bad request
becomes a clear error and never a crash.
"""


import grpc


class FieldError(ValueError):
    """A request field is invalid; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field
        self.message = message

    def __reduce__(self):  # picklable, so it crosses Ray's process boundary intact
        return FieldError, (self.code, self.field, self.message)


def invalid(field: str, message: str) -> FieldError:
    return FieldError(grpc.StatusCode.INVALID_ARGUMENT, field, message)


def out_of_range(field: str, message: str) -> FieldError:
    return FieldError(grpc.StatusCode.OUT_OF_RANGE, field, message)


# A sampling temperature is 0 (greedy) or in this range: logits / T must stay finite in float32
# (T = 1e-45 overflowed to NaN probabilities), and above the range every distribution is uniform.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4


def check_sampling(temperature: float, top_k: int, top_p: float, prefix: str = "") -> None:
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):  # also refuses NaN
        raise invalid(prefix + "temperature", f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], "
                      f"got {temperature}")
    if top_k < 0:
        raise invalid(prefix + "top_k", f"must be >= 0, got {top_k}")
    if not (0 < top_p <= 1):  # also refuses NaN
        raise invalid(prefix + "top_p", f"must be in (0, 1], got {top_p}")


def check_token_ids(field: str, tokens: list[int], vocab_size: int) -> None:
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab_size:
            raise invalid(f"{field}[{i}]", f"token id {t} is outside the vocabulary [0, {vocab_size})")


def check_session_id(session_id: str) -> None:
    if not session_id:
        raise invalid("session_id", "must not be empty")
    if len(session_id) > 128:
        raise invalid("session_id", "must be at most 128 characters")


def check_context(field: str, length: int, max_context: int) -> None:
    if length > max_context:
        raise out_of_range(field, f"sequence of {length} tokens exceeds the context of {max_context}")
