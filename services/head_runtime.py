"""A target verifier's runtime that drafts with an EAGLE-3 head (tandem.services.head): the
target's passes also tap the hidden states the head reads, and the head keeps a KV cache per
session in a pool of its own.

A session's head state follows the committed sequence the way the target's cache does, from
what the verify calls feed: the target's token list (cropped and extended as its cache is), the
tapped features of the positions the head has not read yet, and how many of the head's rows
read committed tokens with the target's features (`rows`; row p reads position p's features
and the token at p + 1). After a verify, the drafting job's first `HeadStep` catches the head up
to the committed tokens, the cycle's outcome token last, and drafts the next block's first
token from the last row; each later step drafts one more from the head's own output. Rows past
the committed tokens (the drafted ones) are recomputed with the target's features once the
target has verified them: the next catch-up starts at `rows`.

A token tree drafts one step per depth, each node reading its parent's output under the tree
mask (a node's row is its path's chain row). A tree's verify feeds the target the tree; its
features join the token list when the cache keeps the accepted path (`keep_paths`), the path's
only: under the tree mask they are the sequence's.

A row stays valid while the tokens it read agree with every token list the target is fed
since: a verify that feeds different tokens where the head read others (a rejection, a resume
that rewinds) drops the rows from there. Features the head has read are kept no longer than it
needs them; when a rewind asks for features already dropped, the session is released, so that
the caller's next call misses and re-prefills the target, features and all (invariant 2).
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import AutoConfig

from tandem.services import head as head_files
from tandem.services.head_pass import HeadFeed, HeadPass
from tandem.services.kv import BlockTable
from tandem.services.llama import Feed, LlamaPass
from tandem.services.runtime import CacheMiss, KeepPath, ModelRuntime, Step, make_room


@dataclass(frozen=True)
class HeadStep(Step):
    """A step of the head's drafting job (tandem.services.draft_worker.propose's or propose_tree's
    shape): the tokens at positions cache_len.. of the sequence (a tree's nodes with parents);
    the first after a verify catches up to them."""


class _Features:
    """The target's tapped hidden states of consecutive positions first.., kept as its passes gave
    them and joined only when the head reads them: a session that does not draft for a while adds
    a piece per verify and copies nothing (joined every 64 pieces, so that crops stay cheap)."""

    def __init__(self, first: int, rows: torch.Tensor) -> None:
        self.first, self.pieces, self.end = first, [rows], first + len(rows)  # pieces: [n_i, taps·H] each

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    def put(self, start: int, rows: torch.Tensor) -> None:
        """Positions start.. are these now (a start past the end: only these are kept)."""
        if not self.first <= start <= self.end:
            self.first, self.pieces = start, [rows]
        else:
            if start < self.end:  # a rewind: crop (the common case appends)
                self.pieces = [self.read(self.first, start)]
            self.pieces.append(rows)
            if len(self.pieces) > 64:
                self.pieces = [torch.cat(self.pieces)]
        self.end = start + len(rows)

    def read(self, start: int, end: int) -> torch.Tensor:
        """[end − start, taps·H] the features of positions start..end (all kept: the caller checks)."""
        if len(self.pieces) > 1:
            self.pieces = [torch.cat(self.pieces)]
        return self.pieces[0][start - self.first:end - self.first]

    def drop_before(self, position: int) -> None:
        self.pieces, self.first = [self.read(position, self.end)], position


@dataclass
class _Head:
    cache: BlockTable
    tokens: list[int] = field(default_factory=list)  # the target's token list (its cache's)
    rows: int = 0  # the head's rows over committed tokens, read with the target's features
    read: list[int] = field(default_factory=list)  # the tokens those rows read: positions 0..rows
    features: _Features | None = None  # the target's, of the positions the head may still read
    last: torch.Tensor | None = None  # [k, H] the head's outputs at its latest step's kept rows
    last_node: int = -1  # the drafted node the first of them read (−1: the catch-up's, under the root)
    drafting: bool = False  # a catch-up ran since the target's latest step: steps draft


class HeadRuntime(ModelRuntime):
    """The target model, its taps and an EAGLE-3 head. Not thread-safe: call from one thread."""

    draft_step = HeadStep  # what the verifier's drafting job yields (tandem.services.target_verifier)

    def __init__(self, model_dir: str, head_dir: str, device: str = "cpu", dtype: str = "float32",
                 max_cache_bytes: int = 2 << 30) -> None:
        """Raises HeadError naming what does not fit the target."""
        super().__init__(model_dir, device, dtype, max_cache_bytes)
        if not isinstance(self.forward_pass, LlamaPass):
            raise head_files.HeadError("--head", f"a head drafts from tandem's Llama pass; {model_dir} is not one")
        config = AutoConfig.from_pretrained(model_dir)
        head = head_files.load(head_dir, config)
        self.taps = head.config.taps
        # The head's one layer holds about 1/L of the target's cache per token: its pool gets a share
        # of the bound in that proportion (at least a sixteenth).
        share = max(max_cache_bytes // (config.num_hidden_layers + 1), max_cache_bytes // 16)
        self.head = HeadPass(head, self.forward_pass.embed, self.device.type == "cpu", share)
        self.info = replace(self.info, drafter="head", draft_model=str(Path(head_dir)))
        self._heads: dict[str, _Head] = {}
        self._trees: dict[str, tuple[Step, torch.Tensor]] = {}  # a tree's verify step and its features

    @property
    def cache_bytes(self) -> int:
        heads = list(self._heads.values())  # one C-level copy: the metrics thread reads while the model thread writes
        features = sum(h.features.nbytes for h in heads if h.features is not None)
        return super().cache_bytes + self.head.cache_bytes + features

    # --- the target's passes: tap them -------------------------------------------------------

    def forward(self, feeds: list[Feed], steps: list[Step]) -> list[torch.Tensor]:
        logits, features = self.forward_pass.forward_tapped(feeds, self.taps)
        for step, tapped in zip(steps, features):
            if step.parents is None:
                self._fed(step.session_id, step.cache_len, list(step.tokens), tapped)
            else:  # a token tree's verify: its features wait for the path the cache keeps (keep_paths)
                self._trees[step.session_id] = (step, tapped)
        return logits

    def keep_paths(self, keeps: list[KeepPath]) -> list[bool]:
        """The target's cache keeps a tree's path: so does the head's token list, with the path's
        features (a node's, under the tree mask, are those of the sequence it ends)."""
        held = super().keep_paths(keeps)
        for keep, kept in zip(keeps, held):
            pending = self._trees.pop(keep.session_id, None)
            if pending is not None and kept:
                step, tapped = pending
                tail = keep.start - step.cache_len  # the committed tokens fed before the tree
                index = list(range(tail)) + [tail + node for node in keep.nodes]
                self._fed(keep.session_id, step.cache_len, [step.tokens[i] for i in index], tapped[index])
        return held

    def _fed(self, session_id: str, c: int, new: list[int], features: torch.Tensor) -> None:
        """The target's cache holds `new` at c..: follow its token list, keep their features."""
        h = self._heads.get(session_id)
        if h is None or c == 0:
            self._forget(session_id)
            h = self._heads[session_id] = _Head(self.head.new_cache())
        h.tokens[c:] = new
        j = c  # the first position where the head read another token than the target now has
        while j < len(h.read) and j - c < len(new) and h.read[j] == new[j - c]:
            j += 1
        if j < len(h.read) and j - c < len(new):
            del h.read[j:]
            h.rows = min(h.rows, max(j - 1, 0))
        if h.features is None:
            h.features = _Features(c, features)
        else:
            h.features.put(c, features)
        h.drafting = False

    # --- the head's passes -------------------------------------------------------------------

    def extend_batch(self, steps: list[Step]) -> list:
        """The target's steps as ModelRuntime runs them (tapped), and the HeadSteps in one pass of
        the head → per step its logits, or its CacheMiss."""
        drafting = [i for i, step in enumerate(steps) if isinstance(step, HeadStep)]
        if not drafting:
            return super().extend_batch(steps)
        results: list = [None] * len(steps)
        target = [i for i, step in enumerate(steps) if not isinstance(step, HeadStep)]
        for i, out in zip(target, super().extend_batch([steps[i] for i in target]) if target else []):
            results[i] = out
        for i, out in zip(drafting, self._draft([steps[i] for i in drafting])):
            results[i] = out
        return results

    def _draft(self, steps: list[HeadStep]) -> list:
        feeds, runs, results = [], [], [None] * len(steps)
        in_pass = {step.session_id for step in steps}
        for i, step in enumerate(steps):
            h = self._heads.get(step.session_id)
            feed = self._feed(step, h) if h is not None and self.held(step.session_id) else None
            if feed is None or not self._reserve_head(h, feed.start + len(feed.tokens), in_pass):
                results[i] = CacheMiss(step.session_id)
                continue
            feeds.append(feed)
            runs.append((i, step, h))
        if not feeds:
            return results
        with torch.inference_mode():
            outs = self.head.forward_batch(feeds)
        for (i, step, h), feed, (logits, last) in zip(runs, feeds, outs):
            h.last, h.last_node = last, self._first_node(step)
            if not h.drafting:  # a catch-up: the rows up to the committed tokens are the head's now
                end = step.cache_len + len(step.tokens)  # the committed tokens
                h.rows = end - 1
                # What the rows read is the committed sequence: h.read agrees with h.tokens wherever
                # both reach (_fed drops what a later step changed), so only its end is written.
                del h.read[step.cache_len:]
                h.read += h.tokens[len(h.read):step.cache_len] + list(step.tokens)
                h.features.drop_before(end - 1)  # the next verify's first feature
                h.drafting = True
            results[i] = logits
        return results

    def _feed(self, step: HeadStep, h: _Head) -> HeadFeed | None:
        """The head's rows for a step: a catch-up's from `rows` to the step's last token (each
        reading the target's features; None when they are gone), a drafting step's one row per
        token (a token tree's nodes: each reads its parent's output, under the tree mask)."""
        if h.drafting:
            self.head.crop(h.cache, step.cache_len - 1)
            if step.parents is None:  # a chain's next token, after the latest row
                hidden = h.last[-1:]
            else:
                hidden = h.last[[p - h.last_node for p in step.parents[-len(step.tokens):]]]  # [n, H]
            return HeadFeed(h.cache, step.cache_len - 1, list(step.tokens), step.keep, step.parents, hidden)
        end = step.cache_len + len(step.tokens)  # the committed tokens, the step's last
        start = min(h.rows, end - 2)  # at least the last row: its output drafts
        if start < h.features.first or end - 1 > h.features.end:
            self.release(step.session_id)  # a rewind past the features kept: re-prefill (the docstring)
            return None
        self.head.crop(h.cache, start)
        hidden = self.head.project(h.features.read(start, end - 1))  # [rows, H]
        read = (h.tokens[start + 1:step.cache_len] + list(step.tokens))[start + 1 - end:]  # positions start + 1 ..
        return HeadFeed(h.cache, start, read, 1, hidden=hidden)

    @staticmethod
    def _first_node(step: HeadStep) -> int:
        """The tree node a step's first token is (−1: a catch-up's or a chain's, whose next step
        reads its last row)."""
        return -1 if step.parents is None else len(step.parents) - len(step.tokens)

    def _reserve_head(self, h: _Head, tokens: int, in_pass: set[str]) -> bool:
        """Room in the head's pool, evicting the heads of sessions outside the pass (their next
        catch-up then finds no features and re-prefills)."""
        return make_room(lambda: self.head.reserve(h.cache, tokens), self._heads, in_pass, self.release)

    def release(self, session_id: str) -> bool:
        with self._lock:
            self._forget(session_id)
            return super().release(session_id)

    def _forget(self, session_id: str) -> None:
        self._trees.pop(session_id, None)
        h = self._heads.pop(session_id, None)
        if h is not None:
            self.head.release(h.cache)
