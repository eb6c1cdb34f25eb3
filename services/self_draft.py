"""A target verifier that drafts with its own first layers (LayerSkip's self-speculation): the
first K layers of the target, then its final norm and LM head, propose the next block.

Their keys and values are the target's own: a drafting step runs the exit layers over its token
in the session's cache, so it reads the committed tokens' keys and values as the target wrote
them, and writes its own at the drafted positions of the first K layers only. The verify that
checks the block crops the cache to the committed tokens and runs every layer over the block
(the orchestrator's cache_len never trusts anything past them), so verification is the target's
whatever the drafts wrote. Without early-exit training a shallow exit agrees with the target
less than a trained draft does: docs/drafters.md, "Drafting inside the verifier", has the
measurements (benchmarks/self_draft_exits.py).
"""

from dataclasses import dataclass, replace

import torch

from tandem.services.llama import Feed, LlamaPass
from tandem.services.runtime import ModelRuntime, Step


@dataclass(frozen=True)
class ExitStep(Step):
    """A drafting step: the step's tokens through the target's first `exit_layer` layers only."""


class SelfDraftRuntime(ModelRuntime):
    """The target model, which also drafts through its first exit_layer layers."""

    draft_step = ExitStep

    def __init__(self, model_dir: str, exit_layer: int, device: str = "cpu", dtype: str = "float32",
                 max_cache_bytes: int = 2 << 30) -> None:
        """Raises ValueError naming --exit-layer when the target has no such layer to exit at."""
        super().__init__(model_dir, device, dtype, max_cache_bytes)
        if not isinstance(self.forward_pass, LlamaPass):
            raise ValueError(f"--exit-layer: self-drafting runs on tandem's Llama pass; {model_dir} is not one")
        layers = len(self.forward_pass.layers)
        if not 1 <= exit_layer < layers:
            raise ValueError(f"--exit-layer must be in [1, {layers - 1}] for a target of {layers} layers, "
                             f"got {exit_layer}")
        self.exit_layer = exit_layer
        self.info = replace(self.info, drafter="self", draft_model=f"{model_dir} (exit layer {exit_layer})")

    def extend_batch(self, steps: list[Step]) -> list:
        """The target's steps in one pass and the drafting steps in another, through the exit layers."""
        drafting = [isinstance(step, ExitStep) for step in steps]
        if all(drafting) or not any(drafting):
            return super().extend_batch(steps)
        results: list = [None] * len(steps)
        for kind in (False, True):
            index = [i for i, d in enumerate(drafting) if d == kind]
            for i, out in zip(index, super().extend_batch([steps[i] for i in index])):
                results[i] = out
        return results

    def forward(self, feeds: list[Feed], steps: list[Step]) -> list[torch.Tensor]:
        exit_layer = self.exit_layer if isinstance(steps[0], ExitStep) else None
        return self.forward_pass.forward_batch(feeds, exit_layer=exit_layer)
