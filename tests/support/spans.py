"""OTLP spans as the test receiver (tandem.bench.otlp) holds them: protobuf messages."""


def attributes(span) -> dict:
    """A span's attributes as plain Python values (arrays as lists)."""

    def value(v):
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(x) for x in v.array_value.values]
        return getattr(v, kind)

    return {a.key: value(a.value) for a in span.attributes}
