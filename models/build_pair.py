"""Rebuild tandem's shipped draft/target pair from scratch, deterministically.

    .venv/bin/python models/build_pair.py                    # about an hour on two CPU cores
    .venv/bin/python models/build_pair.py --budget smoke     # a minute: checks the pipeline
    .venv/bin/python models/build_pair.py --budget gpu       # a larger pair where CUDA exists
    .venv/bin/python models/build_pair.py --steps-scale 0.5  # half the steps, on a slower machine

Stages (each prints a progress bar):
  1. corpus      the standard library's .py files (no tests, nothing from site-packages);
                 every 50th file is held out for an in-distribution validation loss
  2. tokenizer   byte-level BPE (`tokenizers`), saved for AutoTokenizer.from_pretrained
  3. target      a Llama causal LM trained from scratch on the corpus
  4. drafts      (a) a 1-layer model distilled from the target by KL on its next-token
                 distributions, (b) the target's first layer plus its head, fine-tuned the
                 same way; both are measured and the one with the higher analytic speedup ships
  5. evaluate    held-out loss on third-party code (site-packages, never trained on), greedy
                 agreement and T=1 acceptance along the target's continuations of the held-out
                 prompt file, draft/target cost per token on this machine

Writes models/target, models/draft (HF directories, safetensors), models/results.json and
models/loss.png. Intermediate files go to .tandem/build/.
"""

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tandem.bench.corpus import load_prompts, read, stdlib_files, thirdparty_files
from tandem.distill import draft_loss
from tandem.suitability import check_pair

ROOT = Path(__file__).resolve().parent.parent
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>"]


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int


@dataclass(frozen=True)
class Budget:
    vocab: int
    context: int  # training window, tokens
    batch: int  # windows per step
    target: Shape
    draft: Shape
    target_steps: int
    distill_steps: int
    truncated_steps: int
    target_lr: float
    draft_lr: float
    eval_prompts: int
    eval_new_tokens: int


BUDGETS = {
    "smoke": Budget(vocab=1024, context=64, batch=4, target=Shape(2, 64, 128, 2, 1), draft=Shape(1, 32, 64, 1, 1),
                    target_steps=30, distill_steps=20, truncated_steps=10, target_lr=3e-3, draft_lr=3e-3,
                    eval_prompts=4, eval_new_tokens=16),
    "cpu-hour": Budget(vocab=4096, context=256, batch=8, target=Shape(6, 384, 1024, 6, 3),
                       draft=Shape(1, 128, 384, 2, 1), target_steps=1400, distill_steps=900, truncated_steps=300,
                       target_lr=2e-3, draft_lr=3e-3, eval_prompts=48, eval_new_tokens=64),
    "gpu": Budget(vocab=8192, context=512, batch=32, target=Shape(12, 768, 2048, 12, 4),
                  draft=Shape(2, 256, 768, 4, 2), target_steps=20000, distill_steps=8000, truncated_steps=2000,
                  target_lr=1e-3, draft_lr=2e-3, eval_prompts=96, eval_new_tokens=64),
}


def scaled(budget: Budget, factor: float) -> Budget:
    steps = {k: max(1, round(getattr(budget, k) * factor)) for k in ("target_steps", "distill_steps", "truncated_steps")}
    return replace(budget, **steps)


# --- 1. corpus ---------------------------------------------------------------------------------


def split_corpus(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, validation): every 50th file is validation."""
    return [f for i, f in enumerate(files) if i % 50], [f for i, f in enumerate(files) if i % 50 == 0]


# --- 2. tokenizer ------------------------------------------------------------------------------


def train_tokenizer(texts, vocab_size: int, length: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with tandem's special tokens (pad, bos, eos), with a progress bar."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=True,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=length)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL[0], bos_token=SPECIAL[1],
                                   eos_token=SPECIAL[2], model_max_length=1024)


def train_and_save_tokenizer(files: list[Path], vocab: int, out: Path):
    train_tokenizer((read(f) for f in files), vocab, length=len(files)).save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)


def encode(tokenizer, files: list[Path], desc: str) -> torch.Tensor:
    """All files as one stream of token ids, each file followed by EOS.  [n_tokens] int64"""
    ids: list[int] = []
    for f in tqdm(files, desc=desc, unit="file"):
        ids += tokenizer(read(f), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


# --- 3. models ---------------------------------------------------------------------------------


def llama(shape: Shape, tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def batches(stream: torch.Tensor, budget: Budget, steps: int, seed: int):
    """Random windows of the stream, seeded.  yields [batch, context + 1] int64"""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - budget.context - 1, (budget.batch,), generator=gen)
        yield torch.stack([stream[s:s + budget.context + 1] for s in starts.tolist()])


def lr_at(step: int, steps: int, peak: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def optimizer(model, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def next_token_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each window's next tokens.  windows: [b, context + 1]"""
    logits = model(input_ids=windows[:, :-1]).logits  # [b, context, vocab]
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())


def distill_loss(draft, target, windows: torch.Tensor) -> torch.Tensor:
    """KL(target || draft) at T=1, per token, as `tandem distill` trains.  windows: [b, context + 1]"""
    return draft_loss(draft, target, windows[:, :-1])


@torch.no_grad()
def eval_loss(model, stream: torch.Tensor, context: int, device: str, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy over consecutive windows of the stream."""
    model.eval()
    n = min(max_windows, (len(stream) - 1) // context)
    windows = torch.stack([stream[i * context:(i + 1) * context + 1] for i in range(n)]).to(device)
    losses = [next_token_loss(model, w).item() for w in windows.split(8)]
    model.train()
    return sum(losses) / len(losses)


def fit(model, loss_of, train: torch.Tensor, budget: Budget, steps: int, peak_lr: float, seed: int, device: str,
        desc: str, metric: str, evaluate=None) -> list:
    """The loop every stage shares: seeded windows, AdamW, warmup then cosine, clipped gradients.
    loss_of(windows) gives the loss; evaluate(), if given, runs every 100 steps and at the end."""
    opt = optimizer(model, peak_lr)
    curve = []
    bar = tqdm(enumerate(batches(train, budget, steps, seed)), total=steps, desc=desc, unit="step")
    for step, batch in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        loss = loss_of(batch.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append({"step": step, metric: loss.item()})
        if evaluate and (step % 100 == 0 or step == steps - 1):
            curve[-1]["val_loss"] = evaluate()
        bar.set_postfix({metric: f"{loss.item():.3f}"})
    return curve


def truncated_draft(target, layers: int) -> LlamaForCausalLM:
    """The target's first `layers` layers, final norm and head, as a model of its own."""
    config = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": layers})
    draft = LlamaForCausalLM(config)
    missing, unexpected = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing, missing  # the unexpected keys are the dropped layers
    return draft


# --- 5. evaluation and output ------------------------------------------------------------------


def save(model, tokenizer, out: Path) -> None:
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to("cpu").save_pretrained(out)
    tokenizer.save_pretrained(out)


def relative_paths(report: dict) -> dict:
    return {**report, **{k: str(Path(report[k]).resolve().relative_to(ROOT)) for k in ("draft", "target")
                         if Path(report[k]).resolve().is_relative_to(ROOT)}}


def plot(curves: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    target = curves["target"]
    axes[0].plot([c["step"] for c in target], [c["train_loss"] for c in target], lw=0.6, alpha=0.6, label="train")
    val = [c for c in target if "val_loss" in c]
    axes[0].plot([c["step"] for c in val], [c["val_loss"] for c in val], "o-", label="validation (stdlib)")
    axes[0].set(title="target: cross-entropy", xlabel="step", ylabel="nats/token")
    axes[0].legend()
    for name in ("distilled", "truncated"):
        axes[1].plot([c["step"] for c in curves[name]], [c["kl"] for c in curves[name]], lw=0.6, label=name)
    axes[1].set(title="drafts: KL(target || draft)", xlabel="step", ylabel="nats/token", yscale="log")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def train_new_target(tokenizer, train, val, budget: Budget, args):
    torch.manual_seed(args.seed)
    target = llama(budget.target, tokenizer).to(args.device)
    return target, fit(target, lambda w: next_token_loss(target, w), train, budget, budget.target_steps,
                       budget.target_lr, args.seed, args.device, "target", "train_loss",
                       evaluate=lambda: eval_loss(target, val, budget.context, args.device, max_windows=16))


def distill_new_draft(target, tokenizer, train, budget: Budget, args):
    torch.manual_seed(args.seed + 1)
    draft = llama(budget.draft, tokenizer).to(args.device)
    return draft, fit(draft, lambda w: distill_loss(draft, target.eval(), w), train, budget, budget.distill_steps,
                      budget.draft_lr, args.seed + 1, args.device, "distill draft", "kl")


def truncate_target(target, train, budget: Budget, args):
    draft = truncated_draft(target, 1).to(args.device)
    return draft, fit(draft, lambda w: distill_loss(draft, target.eval(), w), train, budget, budget.truncated_steps,
                      budget.draft_lr, args.seed + 2, args.device, "truncated draft", "kl")


def stage(out: Path, reuse: bool, build, tokenizer, record: dict):
    """Run one training stage, or load its result from a previous run with --reuse.
    record collects each stage's loss curve and training minutes."""
    name = out.name.removeprefix("draft-")
    if reuse and (out / "config.json").exists():
        print(f"reusing {out}", flush=True)
        model = LlamaForCausalLM.from_pretrained(out)
        saved = json.loads((out / "stage.json").read_text())
    else:
        started = time.time()
        model, curve = build()
        saved = {"curve": curve, "minutes": round((time.time() - started) / 60, 1)}
        save(model, tokenizer, out)
        (out / "stage.json").write_text(json.dumps(saved))
    return model, {**record, name: saved}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=BUDGETS, default="cpu-hour")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply every stage's steps (e.g. 0.5 on a slower machine; 1 is the shipped run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "models")
    parser.add_argument("--work", type=Path, default=ROOT / ".tandem" / "build")
    parser.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout.jsonl")
    parser.add_argument("--reuse", action="store_true", help="load stages already built in --work")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    budget = scaled(BUDGETS[args.budget], args.steps_scale)
    torch.manual_seed(args.seed)
    work = args.work / args.budget
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    train_files, val_files = split_corpus(stdlib_files())
    tokenizer = train_and_save_tokenizer(train_files, budget.vocab, work / "tokenizer")
    train = encode(tokenizer, train_files, "encode stdlib")
    val = encode(tokenizer, val_files, "encode stdlib (validation)")
    heldout = encode(tokenizer, thirdparty_files(), "encode third-party (held out)")
    print(f"corpus: {len(train_files)} files, {len(train):,} training tokens; validation {len(val):,}; "
          f"held-out third-party {len(heldout):,}", flush=True)

    target, stages = stage(work / "target", args.reuse, lambda: train_new_target(tokenizer, train, val, budget, args),
                           tokenizer, {})
    distilled, stages = stage(work / "draft-distilled", args.reuse,
                              lambda: distill_new_draft(target, tokenizer, train, budget, args), tokenizer, stages)
    truncated, stages = stage(work / "draft-truncated", args.reuse,
                              lambda: truncate_target(target, train, budget, args), tokenizer, stages)
    curves = {name: saved["curve"] for name, saved in stages.items()}
    plot(curves, args.out / "loss.png")

    prompts = load_prompts(args.prompts)[:budget.eval_prompts]
    drafts = {name: work / f"draft-{name}" for name in ("distilled", "truncated")}
    reports = {name: check_pair(str(path), str(work / "target"), prompts, max_new_tokens=budget.eval_new_tokens)
               for name, path in drafts.items()}
    shipped = max(reports, key=lambda name: reports[name].speedup)
    losses = {name: eval_loss(model.to(args.device), heldout, budget.context, args.device)
              for name, model in (("target", target), ("distilled", distilled), ("truncated", truncated))}
    save(target, tokenizer, args.out / "target")
    save({"distilled": distilled, "truncated": truncated}[shipped], tokenizer, args.out / "draft")
    results = {
        "budget": args.budget, "seed": args.seed, "shape": asdict(budget), "device": args.device,
        "minutes": {"this_run": round((time.time() - started) / 60, 1),
                    **{name: saved["minutes"] for name, saved in stages.items()}},
        "tokens": {"train": len(train), "validation": len(val), "heldout": len(heldout),
                   "target_trained": budget.target_steps * budget.batch * budget.context,
                   "draft_distilled": budget.distill_steps * budget.batch * budget.context},
        "parameters": {"target": target.num_parameters(), "distilled": distilled.num_parameters(),
                       "truncated": truncated.num_parameters()},
        "final_val_loss": curves["target"][-1]["val_loss"], "heldout_loss": losses,
        "drafts": {name: relative_paths(report.as_dict()) for name, report in reports.items()}, "shipped": shipped,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
