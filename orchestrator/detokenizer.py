"""Incremental detokenization that never splits a UTF-8 character across chunks."""


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already sent

    def push(self, token_ids: list[int], final: bool = False) -> str:
        """Add tokens; return the new text that is complete (all of it when final)."""
        if self.tokenizer is None:
            return ""
        self.token_ids.extend(token_ids)
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if not final and text.endswith("\ufffd"):  # bytes of a character still to come
            return ""
        delta, self.emitted = text[self.emitted :], len(text)
        return delta
