"""Stop strings (the OpenAI API's `stop`): a streamed text is cut before the first place where
one of them occurs, and text that might still become one is held back until it cannot.

What is released depends only on the text pushed so far, never on how it was split into
pushes: a resumed stream that pushes the text its client already had, and then the rest,
releases exactly what the first stream would have.
"""


class StopStrings:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""  # pushed, not released: it ends with a prefix of a stop string
        self.released = 0  # characters released so far
        self.matched = False
        self.end = 0  # after a match: where the stop string ends in the whole text pushed

    def push(self, text: str, final: bool = False) -> str:
        """Add text; return the part that is released now. After a match, nothing more is
        released (`matched` is True); at the end (final) all held text is released."""
        if not self.stops or self.matched:
            return "" if self.matched else self._release(text)
        text = self.held + text
        # Where a stop string may still begin that the text does not hold whole yet: a match
        # found past it waits, since one that starts there would come first.
        pending = len(text) - (0 if final else self._partial(text))
        found = [(i, i + len(s)) for s in self.stops if (i := text.find(s)) >= 0]
        if found and min(found)[0] <= pending:
            cut, end = min(found)
            self.matched, self.held, self.end = True, "", self.released + end
            return self._release(text[:cut])
        self.held = text[pending:]
        return self._release(text[:pending])

    def _partial(self, text: str) -> int:
        """The length of the longest end of text that begins some stop string."""
        for length in range(min(len(text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            end = text[-length:]
            if any(s.startswith(end) for s in self.stops):
                return length
        return 0

    def _release(self, text: str) -> str:
        self.released += len(text)
        return text
