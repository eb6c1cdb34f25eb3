"""Training an EAGLE-3 head (tandem.services.head) for a target, on the target's own outputs.

The teacher is the target itself: for every window of training tokens it gives the features the
head reads (the hidden states entering the tapped layers) and its next-token distributions,
which the head learns by KL(target ‖ head) at every step of EAGLE-3's training-time test
(`Eagle3Head.unroll`, the drafting steps as serving runs them), later steps weighted less
(0.8^k, as EAGLE-3 does). Windows of the target's own greedy continuations teach the head what
it will be asked to draft; windows of a corpus teach it the domain.
"""

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from tandem.services.head import Eagle3Head, HeadConfig

STEP_WEIGHT = 0.8  # a training-time-test step's loss weight is STEP_WEIGHT ** k


def head_config(target_config, taps: tuple[int, ...] | None = None) -> HeadConfig:
    """A head of the target's width and attention shape, reading vLLM's default taps
    (2, L//2, L−3 for L ≥ 8 layers; for a shallower target an early layer, the middle one and the
    last layer's output)."""
    layers = target_config.num_hidden_layers
    if taps is None:
        taps = (2, layers // 2, layers - 3) if layers >= 8 else tuple(sorted({int(layers >= 4), layers // 2, layers}))
    t = target_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    rope = getattr(t, "rope_parameters", None) or {}
    return HeadConfig(t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads, head_dim,
                      t.rms_norm_eps, rope.get("rope_theta", getattr(t, "rope_theta", 10000.0)),
                      t.max_position_embeddings, t.vocab_size, t.vocab_size, t.hidden_size, tuple(taps))


def teacher(target: torch.nn.Module, taps: tuple[int, ...], windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target on windows [B, N] → (features [B, N, 3·H]: the hidden states entering the tapped
    layers, tap L being the last layer's output before the final norm; log-probabilities
    [B, N, V] of the token after each position)."""
    captured = {}
    hook = target.model.layers[-1].register_forward_hook(
        lambda module, args, out: captured.update(last=out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = target(windows, output_hidden_states=True)
    finally:
        hook.remove()
    layers = len(target.model.layers)
    states = [captured["last"] if t == layers else out.hidden_states[t] for t in taps]
    return torch.cat(states, -1), out.logits.float().log_softmax(-1)


def loss(head: Eagle3Head, target: torch.nn.Module, windows: torch.Tensor, steps: int) -> torch.Tensor:
    """The head's training loss on windows [B, N] of token ids: Σ_k STEP_WEIGHT^k · KL(target ‖
    head) at step k, averaged over the rows that have a teacher (row t at step k predicts the
    token at t + k + 2, whose distribution the target gives at t + k + 1)."""
    features, teacher_logp = teacher(target, head.config.taps, windows)
    rows = windows.shape[1] - steps - 1  # rows 0..T−1 keep every step's label inside the window
    embed = target.model.embed_tokens(windows[:, 1:rows + steps])  # [B, T + steps − 1, H]
    total = windows.new_zeros((), dtype=torch.float32)
    to_target = head.draft_to_target()
    for k, logits in enumerate(head.unroll(embed.detach(), features[:, :rows], steps)):
        want = teacher_logp[:, k + 1:k + 1 + rows][..., to_target]  # [B, T, draft vocab]
        want = want.log_softmax(-1)  # the target's distribution over the draft's vocabulary
        got = logits.float().log_softmax(-1)
        kl = F.kl_div(got, want, log_target=True, reduction="none").sum(-1).mean()
        total = total + STEP_WEIGHT**k * kl
    return total


def train(head: Eagle3Head, target: torch.nn.Module, batches: Iterable[torch.Tensor], steps: int, lr: float,
          ttt_steps: int = 3, progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Train the head (in place) on `steps` batches of windows [B, N], the target frozen, AdamW with
    a linear warm-up over the first 5 % and a cosine decay → the loss per step. progress(step,
    loss) after each."""
    target.eval().requires_grad_(False)
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    history = []
    for step, windows in zip(range(steps), batches):
        scale = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        value = loss(head, target, windows, ttt_steps)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append(value.item())
        if progress:
            progress(step, history[-1])
    head.eval()
    return history


def new_head(target: torch.nn.Module, taps: tuple[int, ...] | None = None) -> Eagle3Head:
    """A head for the target (head_config), its output layer started from the target's own
    (norm and LM head), the rest at PyTorch's initialization."""
    head = Eagle3Head(head_config(target.config, taps))
    with torch.no_grad():
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.lm_head.weight[head.draft_to_target()])
    return head
