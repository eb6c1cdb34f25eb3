"""`tandem distill`: a draft (or an EAGLE-3 head) for a user's own target and domain.

The seeds say what makes speculation pay: a draft that writes what the target writes on the
requests it will serve. So the teacher is the target itself, on the user's text: every training
window's loss is KL(target ‖ student) at each position, and half of every batch is the target's
own greedy continuations of prompts cut from that text (what the draft is asked to draft), half
the text itself (the domain). The draft uses the target's tokenizer and a Llama shape scaled from
the target's (`--draft-config tiny|small` or a JSON of LlamaConfig fields); `--head` trains the
verifier's head instead (tandem.services.head_training, EAGLE-3's training-time test).

Training stops after `--steps` steps or `--minutes` minutes; the learning rate follows the share
of either that has passed (warm-up, then a cosine). A checkpoint (the student, the optimizer, the
step, the continuations) is written to --out every `--checkpoint-minutes` and at the end, and a
run started again with the same --out and the same inputs carries on from it. At the end the
student is saved as a model directory (or a head directory) and measured: a draft by `tandem
check` against the target, on prompts held out from the data (every 20th file) or --prompts; a
head by its greedy agreement at each drafting step on held-out windows.
"""

import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tandem.bench.corpus import load_prompts
from tandem.services import head as head_module
from tandem.services import head_training
from tandem.suitability import check_pair

CHECKPOINT = "checkpoint.pt"
HELD_OUT_EVERY = 20  # every 20th data file is held out for the final check
PROMPT_TOKENS = 32  # of text before each of the target's continuations
CHECK_PROMPTS = 16


@dataclass(frozen=True)
class Plan:
    """What one run trains on and for how long; a checkpoint resumes only the same plan."""

    target: str
    data: tuple[str, ...]  # the files read, in order
    student: str  # "draft:<config JSON>" or "head:<taps>"
    window: int  # tokens per training window
    batch: int  # windows per step, half text and half continuations
    continuations: int  # the pool of the target's continuations, generated first
    lr: float
    seed: int
    steps: int | None  # a stop after this many steps, or
    minutes: float | None  # after this many minutes of training

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def progress(self, step: int, seconds: float) -> float:
        """The share of the run that has passed, in [0, 1]."""
        return min(1.0, step / self.steps) if self.steps else min(1.0, seconds / (60 * self.minutes))


# --- data ------------------------------------------------------------------------------------


def data_files(paths: list[str]) -> list[Path]:
    """The files named, and every file under each directory named, sorted; binary files (a NUL
    byte in their first 8 KB) and empty ones left out. Raises ValueError when none is left."""
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"--data {p}: no such file or directory")
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    text = [f for f in files if f.stat().st_size and b"\0" not in _head(f)]
    if not text:
        raise ValueError("--data: no text files")
    return text


def _head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(8192)


def encode(tokenizer, files: list[Path], eos: int) -> torch.Tensor:
    """The files as one stream of token ids, each followed by EOS.  [n] int64"""
    ids: list[int] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        ids += tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"] + [eos]
    return torch.tensor(ids, dtype=torch.long)


def split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, held out): every HELD_OUT_EVERY-th file held out, of fewer files the middle one, of
    one or two none."""
    if len(files) < 3:
        return files, []
    held = set(range(HELD_OUT_EVERY // 2, len(files), HELD_OUT_EVERY)) if len(files) >= HELD_OUT_EVERY \
        else {len(files) // 2}
    return [f for i, f in enumerate(files) if i not in held], [files[i] for i in sorted(held)]


@torch.no_grad()
def continuations(target, stream: torch.Tensor, count: int, window: int, seed: int, say, batch: int = 16) -> torch.Tensor:
    """[count, window]: random PROMPT_TOKENS-token windows of the stream, each followed by the
    target's greedy continuation to the window's length (EOS does not stop it)."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - PROMPT_TOKENS, (count,), generator=gen)
    prompts = torch.stack([stream[s:s + PROMPT_TOKENS] for s in starts.tolist()]).to(target.device)
    out = []
    for i, chunk in enumerate(prompts.split(batch)):
        out.append(target.generate(chunk, attention_mask=torch.ones_like(chunk), do_sample=False,
                                   max_new_tokens=window - PROMPT_TOKENS, min_new_tokens=window - PROMPT_TOKENS,
                                   eos_token_id=None, pad_token_id=target.config.pad_token_id or 0).cpu())
        say(f"target continuations: {min(count, (i + 1) * batch)}/{count}")
    return torch.cat(out)


def batch_at(stream: torch.Tensor, pool: torch.Tensor, plan: Plan, step: int) -> torch.Tensor:
    """Step `step`'s windows [batch, window], the same however often a run resumes: half random
    windows of the text, half rows of the pool."""
    gen = torch.Generator().manual_seed(plan.seed * 1_000_003 + step)
    half = plan.batch // 2
    starts = torch.randint(0, len(stream) - plan.window, (plan.batch - half,), generator=gen)
    rows = torch.randint(0, len(pool), (half,), generator=gen)
    return torch.cat([torch.stack([stream[s:s + plan.window] for s in starts.tolist()]), pool[rows]])


# --- the students ------------------------------------------------------------------------------


def draft_config(target_config, spec: str) -> LlamaConfig:
    """A Llama draft over the target's vocabulary: tiny (1 layer at a third of the target's
    width), small (2 layers at half of it), or a JSON object of LlamaConfig fields over tiny."""
    width = target_config.hidden_size
    presets = {"tiny": (1, width // 3), "small": (2, width // 2)}
    base = "tiny" if spec.lstrip().startswith("{") else spec
    if base not in presets:
        raise ValueError(f"--draft-config must be tiny, small or a JSON object, got {spec!r}")
    layers, hidden = presets[base]
    hidden = max(64, hidden // 32 * 32)
    heads = max(1, hidden // 64)
    fields = {"vocab_size": target_config.vocab_size, "hidden_size": hidden, "intermediate_size": 3 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2),
              "max_position_embeddings": target_config.max_position_embeddings, "tie_word_embeddings": True,
              "bos_token_id": target_config.bos_token_id, "eos_token_id": target_config.eos_token_id,
              "pad_token_id": target_config.pad_token_id, "rms_norm_eps": target_config.rms_norm_eps}
    if base != spec:
        try:
            fields |= json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"--draft-config: not JSON: {e}") from None
    return LlamaConfig(**fields)


def draft_loss(draft, target, windows: torch.Tensor) -> torch.Tensor:
    """KL(target ‖ draft) at T = 1 per position, averaged.  windows: [b, n]"""
    with torch.no_grad():
        target_logprobs = F.log_softmax(target(input_ids=windows).logits.float(), -1)  # [b, n, V]
    draft_logprobs = F.log_softmax(draft(input_ids=windows).logits.float(), -1)  # [b, n, V]
    return F.kl_div(draft_logprobs.flatten(0, 1), target_logprobs.flatten(0, 1), log_target=True,
                    reduction="batchmean")


@torch.no_grad()
def head_agreement(head, target, windows: torch.Tensor, steps: int = 3) -> list[float]:
    """Per drafting step k, how often the head's argmax is the target's on windows [b, n], the
    head reading the target's features and the true tokens (as drafting does while every earlier
    token is accepted)."""
    features, teacher = head_training.teacher(target, head.config.taps, windows)
    rows = windows.shape[1] - steps - 1
    embed = target.model.embed_tokens(windows[:, 1:rows + steps])
    to_target = head.draft_to_target()
    return [float((to_target[logits.argmax(-1)] == teacher[:, k + 1:k + 1 + rows].argmax(-1)).float().mean())
            for k, logits in enumerate(head.unroll(embed, features[:, :rows], steps))]


# --- the run -----------------------------------------------------------------------------------


def learning_rate(plan: Plan, progress: float) -> float:
    """Warm-up over the first 5 %, then a cosine down to a tenth."""
    if progress < 0.05:
        return plan.lr * max(progress / 0.05, 0.01)
    return plan.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (progress - 0.05) / 0.95)))


class Checkpoint:
    """A run's state in out/checkpoint.pt: written whole, then renamed, so a killed run leaves
    the previous one."""

    def __init__(self, out: Path, plan: Plan) -> None:
        self.path, self.plan = out / CHECKPOINT, plan

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False)
        if state["fingerprint"] != self.plan.fingerprint():
            raise ValueError(f"{self.path} is another run's (target, data, student, shape or budget differ: "
                             f"{state['plan']}); give another --out, or delete it to start over")
        return state

    def save(self, student, optimizer, step: int, seconds: float, pool: torch.Tensor, curve: list) -> None:
        partial = self.path.with_suffix(".partial")
        torch.save({"fingerprint": self.plan.fingerprint(), "plan": asdict(self.plan), "student": student.state_dict(),
                    "optimizer": optimizer.state_dict(), "step": step, "seconds": seconds, "pool": pool,
                    "curve": curve}, partial)
        partial.replace(self.path)


def train(student: torch.nn.Module, loss_of, stream: torch.Tensor, pool: torch.Tensor, plan: Plan,
          checkpoint: Checkpoint, state: dict | None, every_s: float, say) -> list[dict]:
    """The loop: AdamW on the student, one seeded batch per step, the learning rate by the run's
    progress, a line of progress every few seconds and a checkpoint every `every_s` → the curve."""
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, seconds, curve = 0, 0.0, []
    if state:
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        step, seconds, curve = state["step"], state["seconds"], state["curve"]
        say(f"resuming at step {step} ({seconds / 60:.1f} min trained)")
    student.train()
    started, said, saved = time.monotonic() - seconds, 0.0, time.monotonic()
    device = next(student.parameters()).device
    while plan.progress(step, time.monotonic() - started) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(plan, plan.progress(step, time.monotonic() - started))
        loss = loss_of(batch_at(stream, pool, plan, step).to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        elapsed = time.monotonic() - started
        curve.append({"step": step, "seconds": round(elapsed, 2), "kl": loss.item()})
        if elapsed - said >= 5 or plan.progress(step, elapsed) >= 1.0:
            said = elapsed
            done = plan.progress(step, elapsed)
            left = elapsed / max(done, 1e-9) * (1 - done)
            say(f"step {step}  kl {loss.item():.3f}  {done:.0%} of the run  {elapsed / 60:.1f} min  "
                f"about {left / 60:.1f} min left")
        if time.monotonic() - saved >= every_s:
            checkpoint.save(student, optimizer, step, elapsed, pool, curve)
            saved = time.monotonic()
    checkpoint.save(student, optimizer, step, time.monotonic() - started, pool, curve)
    student.eval()
    return curve


def run(target_dir: str, data: list[str], out: str, draft_spec: str = "tiny", steps: int | None = None,
        minutes: float | None = None, device: str = "cpu", head: bool = False, window: int = 128, batch: int = 8,
        continuation_count: int = 64, lr: float = 3e-3, seed: int = 0, prompts: str | None = None,
        checkpoint_minutes: float = 1.0, say=print) -> dict:
    """Distill a draft (or, with head, an EAGLE-3 head) for the target in target_dir on the data
    files → the run's summary, also written to out/distill.json. Raises ValueError on bad input."""
    if (steps is None) == (minutes is None):
        raise ValueError("give --steps or --minutes (one of them)")
    if (steps is not None and steps < 1) or (minutes is not None and minutes <= 0):
        raise ValueError("--steps and --minutes must be positive")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).to(device).eval().requires_grad_(False)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    window = min(window, target.config.max_position_embeddings)
    files = data_files(data)
    train_files, held_out = split(files)
    stream = encode(tokenizer, train_files, eos)
    if len(stream) < window + PROMPT_TOKENS + 1:
        raise ValueError(f"--data: {len(stream)} tokens to train on, fewer than one window ({window})")
    config = None if head else draft_config(target.config, draft_spec)
    student_spec = f"head:{','.join(map(str, head_training.head_config(target.config).taps))}" if head else \
        f"draft:{config.to_json_string(use_diff=False)}"
    plan = Plan(target_dir, tuple(map(str, files)), student_spec, window, batch, continuation_count, lr, seed, steps,
                minutes)
    checkpoint = Checkpoint(out_dir, plan)
    state = checkpoint.load()
    say(f"data: {len(train_files)} files, {len(stream):,} tokens to train on; {len(held_out)} held out")
    pool = state["pool"] if state else continuations(target, stream, continuation_count, window, seed, say)
    torch.manual_seed(seed)
    if head:
        student = head_training.new_head(target).to(device)
        loss_of = lambda w: head_training.loss(student, target, w, 3)  # noqa: E731
    else:
        student = LlamaForCausalLM(config).to(device)
        loss_of = lambda w: draft_loss(student, target, w)  # noqa: E731
    curve = train(student, loss_of, stream, pool, plan, checkpoint, state, 60 * checkpoint_minutes, say)
    summary = {"plan": asdict(plan), "steps": curve[-1]["step"], "minutes": round(curve[-1]["seconds"] / 60, 2),
               "final_kl": curve[-1]["kl"], "parameters": sum(p.numel() for p in student.parameters()),
               "curve": curve}
    held_stream = encode(tokenizer, held_out, eos) if held_out else torch.tensor([], dtype=torch.long)
    if len(held_stream) < window + PROMPT_TOKENS:  # too little held out: the end of the training text
        held_stream = stream[-max(len(stream) // 20, window + PROMPT_TOKENS):]
    if head:
        head_module.save(student.cpu(), out_dir)
        windows = torch.stack([held_stream[i:i + window] for i in range(0, len(held_stream) - window, window)][:16])
        summary["held_out_agreement_per_step"] = head_agreement(student, target.cpu(), windows)
        say(f"head saved to {out_dir}: greedy agreement per drafting step on held-out windows "
            + ", ".join(f"{a:.3f}" for a in summary["held_out_agreement_per_step"]))
    else:
        student.cpu().save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        summary["check"] = _check(str(out_dir), target_dir, prompts, held_stream, say)
    (out_dir / "distill.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _check(draft_dir: str, target_dir: str, prompts: str | None, held_stream: torch.Tensor, say) -> dict:
    """`tandem check` of the saved draft: on --prompts, else on CHECK_PROMPTS cuts of held-out text."""
    if prompts:
        chosen = load_prompts(prompts)[:CHECK_PROMPTS * 2]
    else:
        stride = max(PROMPT_TOKENS, (len(held_stream) - PROMPT_TOKENS) // CHECK_PROMPTS)
        chosen = [held_stream[i:i + PROMPT_TOKENS].tolist() for i in range(0, len(held_stream) - PROMPT_TOKENS,
                                                                           stride)][:CHECK_PROMPTS]
    report = check_pair(draft_dir, target_dir, chosen, max_new_tokens=64)
    say(report.summary())
    return report.as_dict()


def main(args) -> None:
    """The `tandem distill` command."""
    try:
        summary = run(args.target, args.data, args.out, args.draft_config, args.steps, args.minutes, args.device, args.head,
            args.window, args.batch, args.continuations, args.lr, args.seed, args.prompts, args.checkpoint_minutes,
            say=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, OSError) as e:
        raise SystemExit(f"tandem distill: {e}") from None
    print(f"{'head' if args.head else 'draft'} saved to {args.out} after {summary['steps']} steps "
          f"({summary['minutes']} min); the run's numbers: {Path(args.out) / 'distill.json'}")
