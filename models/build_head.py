"""Train an EAGLE-3 draft head (tandem.services.head) for the shipped target and measure it.

    .venv/bin/python models/build_head.py                  # ~15 min of training on one thread, then eval
    .venv/bin/python models/build_head.py --budget smoke   # well under a minute, writes to a temp dir
    .venv/bin/python models/build_head.py --reuse          # reuse the cached corpus tokens and continuations
    .venv/bin/python models/build_head.py --eval-only      # re-measure the head already in models/head
    .venv/bin/python models/build_head.py --steps 300 --lr 3e-3 --draft-vocab 4096 --taps 1,3,6

Stages (each prints a progress bar):
  1. corpus         the standard library's .py files that the target was trained on, tokenized with
                    the target's tokenizer; every 50th file is held out, as models/build_pair.py does
  2. continuations  the target's own greedy continuations (96 tokens) of random 32-token corpus
                    windows, a pool generated up front and cached in .tandem/build/
  3. draft vocab    the --draft-vocab target tokens most frequent in the training data (the corpus
                    and the continuations weighted alike; EOS always in), as d2t / t2d
  4. train          head_training.train on batches of windows, half corpus and half continuations
  5. save           models/head/ (config.json, model.safetensors with bfloat16 weights), loaded
                    back with tandem.services.head.load to check it
  6. evaluate       along the target's greedy continuation (64 tokens) of each held-out prompt, as
                    `tandem check` does: per drafting step k the greedy agreement and the T=1
                    acceptance; chains of gamma = 1..6 drafted along the same continuations (the
                    accepted length + 1 per cycle, greedy); the shipped draft model measured alike

Writes models/head/ and models/head_results.json; caches go to .tandem/build/.
"""

import argparse
import copy
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.bench.corpus import load_prompts, read, stdlib_files
from tandem.services import head as head_module
from tandem.services import head_training
from tandem.services.runtime import eos_token_ids
from tandem.suitability import greedy_continuation

ROOT = Path(__file__).resolve().parent.parent
MAX_GAMMA = 6


@dataclass(frozen=True)
class Budget:
    window: int  # training window, tokens
    prompt: int  # tokens of corpus before each generated continuation
    pool: int  # continuations generated up front
    batch: int  # windows per step (half corpus, half continuations)
    steps: int
    lr: float
    ttt_steps: int
    eval_prompts: int
    eval_new_tokens: int
    files: int | None  # corpus files to read (None: all)


BUDGETS = {
    "smoke": Budget(window=48, prompt=16, pool=16, batch=4, steps=20, lr=3e-3, ttt_steps=3, eval_prompts=4,
                    eval_new_tokens=16, files=12),
    "cpu": Budget(window=128, prompt=32, pool=1024, batch=8, steps=750, lr=3e-3, ttt_steps=3, eval_prompts=48,
                  eval_new_tokens=64, files=None),
}


# --- 1. corpus ---------------------------------------------------------------------------------


def training_files(limit: int | None) -> list[Path]:
    """The standard-library files the target was trained on: all but every 50th (build_pair's
    validation split)."""
    files = [f for i, f in enumerate(stdlib_files()) if i % 50]
    return files[:limit] if limit else files


def encode(tokenizer, files: list[Path]) -> torch.Tensor:
    """All files as one stream of token ids, each followed by EOS (as build_pair.py).  [n] int64"""
    ids: list[int] = []
    for f in tqdm(files, desc="encode stdlib", unit="file"):
        ids += tokenizer(read(f), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def cached(path: Path, meta: dict, reuse: bool, build):
    """build() → tensor, cached at path with meta; with reuse, loaded when the meta matches."""
    if reuse and path.exists():
        saved = torch.load(path)
        if saved["meta"] == meta:
            print(f"reusing {path}", flush=True)
            return saved["data"]
        print(f"{path} was built with {saved['meta']}, not {meta}: rebuilding", flush=True)
    data = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"meta": meta, "data": data}, path)
    return data


# --- 2. continuations --------------------------------------------------------------------------


@torch.no_grad()
def continuations(target, stream: torch.Tensor, budget: Budget, seed: int, batch: int = 64) -> torch.Tensor:
    """[pool, window] random corpus windows of budget.prompt tokens, each followed by the target's
    greedy continuation. EOS does not stop it: what the target writes after a file's end is what
    it saw in training (the next file)."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - budget.prompt, (budget.pool,), generator=gen)
    prompts = torch.stack([stream[s:s + budget.prompt] for s in starts.tolist()])
    out = []
    for chunk in tqdm(prompts.split(batch), desc="target continuations", unit="batch"):
        seqs = target.generate(chunk, attention_mask=torch.ones_like(chunk), do_sample=False,
                               max_new_tokens=budget.window - budget.prompt, min_new_tokens=0,
                               eos_token_id=None, pad_token_id=target.config.pad_token_id)
        assert seqs.shape[1] == budget.window, seqs.shape
        out.append(seqs)
    return torch.cat(out)


def batches(stream: torch.Tensor, pool: torch.Tensor, budget: Budget, seed: int):
    """Endless seeded batches [batch, window]: half random corpus windows, half pool rows."""
    gen = torch.Generator().manual_seed(seed)
    half = budget.batch // 2
    while True:
        starts = torch.randint(0, len(stream) - budget.window, (budget.batch - half,), generator=gen)
        rows = torch.randint(0, len(pool), (half,), generator=gen)
        yield torch.cat([torch.stack([stream[s:s + budget.window] for s in starts.tolist()]), pool[rows]])


# --- 3. the head -------------------------------------------------------------------------------


def draft_vocabulary(stream: torch.Tensor, pool: torch.Tensor, vocab: int, size: int, eos: int) -> torch.Tensor:
    """[size] the target ids the head can draft, ascending: the most frequent in the training data,
    the corpus and the continuations weighted alike, EOS always included."""
    score = (torch.bincount(stream, minlength=vocab).double() / len(stream)
             + torch.bincount(pool.flatten(), minlength=vocab).double() / pool.numel())
    score[eos] = math.inf
    order = torch.sort(-score, stable=True).indices  # ties: lower id first
    return order[:size].sort().values


def build_head(target, taps: tuple[int, ...], used: torch.Tensor) -> head_module.Eagle3Head:
    """A head on `taps` whose draft vocabulary is `used` (target ids, ascending), its norm and LM
    head rows started from the target's, the rest at PyTorch's initialization."""
    config = replace(head_training.head_config(target.config, taps), draft_vocab_size=len(used))
    head = head_module.Eagle3Head(config)
    with torch.no_grad():
        head.d2t.copy_(used - torch.arange(len(used)))
        head.t2d.zero_()
        head.t2d[used] = True
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.lm_head.weight[head.draft_to_target()])
    return head


def save_bf16(head: head_module.Eagle3Head, out: Path) -> None:
    """head_module.save with the float weights in bfloat16 (d2t stays int64, t2d bool)."""
    small = copy.deepcopy(head).to(torch.bfloat16)  # .to(dtype) converts only floating tensors
    assert small.d2t.dtype == torch.long and small.t2d.dtype == torch.bool
    head_module.save(small, out)


def check_saved(head: head_module.Eagle3Head, out: Path, target_config) -> head_module.Eagle3Head:
    """Load the saved head back with tandem.services.head.load and check it is the trained one,
    rounded to bfloat16."""
    loaded = head_module.load(out, target_config)
    want = head.state_dict()
    for name, tensor in loaded.state_dict().items():
        expected = want[name].to(torch.bfloat16).to(tensor.dtype) if want[name].is_floating_point() else want[name]
        assert tensor.dtype == want[name].dtype and torch.equal(tensor, expected), name
    assert loaded.config == head.config
    return loaded


# --- 6. evaluation -----------------------------------------------------------------------------


@torch.no_grad()
def evaluate(head, target, draft, prompts: list[list[int]], new_tokens: int) -> dict:
    """Along the target's greedy continuation of each prompt (as `tandem check`): per drafting
    step k the head's greedy agreement and T=1 acceptance over the same continuation positions;
    per gamma the mean accepted length + 1 of a chain drafted from each position with at least
    MAX_GAMMA continuation tokens left (the head unrolled on the true tokens, which is what
    drafting sees while every earlier draft is accepted); the draft model measured alike."""
    eos = eos_token_ids(target.generation_config) or eos_token_ids(target.config)
    taps, vocab = head.config.taps, target.config.vocab_size
    to_target = head.draft_to_target()
    steps = MAX_GAMMA
    agree = torch.zeros(steps)
    mass = torch.zeros(steps, dtype=torch.float64)
    positions = 0
    covered = 0  # continuation tokens (the target's argmax) inside the draft vocabulary
    chains = torch.zeros(MAX_GAMMA)
    draft_chains = torch.zeros(MAX_GAMMA)
    starts = 0
    d_agree, d_mass = 0, 0.0
    for prompt in tqdm(prompts, desc="evaluate", unit="prompt"):
        cont = greedy_continuation(target, prompt, new_tokens, eos)
        ids = torch.tensor([prompt + cont])  # [1, N]
        P, N = len(prompt), ids.shape[1]
        assert P >= steps + 2, "every drafting step needs a head row before the first continuation token"
        features, logp = head_training.teacher(target, taps, ids)  # [1, N, 3H], [1, N, V]
        logp = logp[0]
        best = logp.argmax(-1)  # [N] the target's greedy choice after each position
        padded = torch.cat([ids, ids.new_zeros(1, steps)], 1)  # rows past the end read padding: never scored
        embed = target.model.embed_tokens(padded[:, 1:N + steps])  # [1, N + steps − 1, H]
        outs = head.unroll(embed, features, steps)  # per k: [1, N, draft vocab], row t → token t + k + 2
        hits = torch.zeros(steps, N, dtype=torch.bool)  # hits[k, t]: step k at row t agrees
        for k, logits in enumerate(outs):
            rows = torch.arange(max(0, P - k - 2), N - k - 2)  # predicting positions P..N−1
            q = torch.zeros(len(rows), vocab, dtype=torch.float64)
            q[:, to_target] = logits[0, rows].double().softmax(-1)
            p = logp[rows + k + 1].double().exp()
            ok = to_target[logits[0, rows].argmax(-1)] == best[rows + k + 1]
            hits[k, rows] = ok
            agree[k] += ok.sum()
            mass[k] += torch.minimum(p, q).sum()
        positions += N - P
        covered += int(head.t2d[best[P - 1:N - 1]].sum())
        # chains drafted from position s (the head's row s − 2), s = P..N − MAX_GAMMA
        d_logits = draft(input_ids=ids).logits[0]  # [N, V]
        d_hit = d_logits.argmax(-1) == best  # d_hit[s − 1]: the draft's token for s agrees
        scored = slice(P - 1, N - 1)
        d_agree += int(d_hit[scored].sum())
        d_mass += float(torch.minimum(d_logits[scored].double().softmax(-1), logp[scored].double().exp()).sum())
        for s in range(P, N - MAX_GAMMA + 1):
            head_run = hits[:, s - 2].int().cumprod(0)  # [steps] 1 while every step so far agrees
            draft_run = d_hit[s - 1:s - 1 + MAX_GAMMA].int().cumprod(0)
            for g in range(1, MAX_GAMMA + 1):
                chains[g - 1] += head_run[:g].sum()
                draft_chains[g - 1] += draft_run[:g].sum()
            starts += 1
    return {
        "prompts": len(prompts), "positions": positions, "chain_starts": starts,
        "draft_vocab_coverage": covered / positions,
        "greedy_agreement_per_step": [round(float(a) / positions, 4) for a in agree],
        "t1_acceptance_per_step": [round(float(m) / positions, 4) for m in mass],
        "tokens_per_cycle_greedy": {g: round(float(chains[g - 1]) / starts + 1, 4) for g in range(1, MAX_GAMMA + 1)},
        "draft_model": {
            "greedy_agreement": round(d_agree / positions, 4), "t1_acceptance": round(d_mass / positions, 4),
            "tokens_per_cycle_greedy": {g: round(float(draft_chains[g - 1]) / starts + 1, 4)
                                        for g in range(1, MAX_GAMMA + 1)},
        },
    }


def table(results: dict) -> str:
    e, d = results["eval"], results["eval"]["draft_model"]
    shipped = results.get("shipped_draft", {})
    lines = [f"head: {results['bytes_on_disk']:,} bytes on disk"]
    if "steps" in results:
        lines = [f"head: taps {results['taps']}, draft vocab {results['config']['draft_vocab_size']}, "
                 f"{results['parameters']:,} parameters, {results['bytes_on_disk']:,} bytes on disk",
                 f"trained {results['steps']} steps, {results['seconds_per_step']:.2f} s/step, "
                 f"final loss {results['final_loss']:.3f} (mean of the last 20 {results['final_loss_last20']:.3f})"]
    lines += [f"{e['positions']} positions over {e['prompts']} held-out prompts; draft vocabulary covers "
             f"{e['draft_vocab_coverage']:.3f} of the target's greedy tokens",
             "",
             "step k                  " + "  ".join(f"{k:>6}" for k in range(len(e["greedy_agreement_per_step"]))),
             "greedy agreement        " + "  ".join(f"{a:6.3f}" for a in e["greedy_agreement_per_step"]),
             "T=1 acceptance          " + "  ".join(f"{a:6.3f}" for a in e["t1_acceptance_per_step"]),
             "",
             "gamma                   " + "  ".join(f"{g:>6}" for g in e["tokens_per_cycle_greedy"]),
             "tokens/cycle, head      " + "  ".join(f"{v:6.3f}" for v in e["tokens_per_cycle_greedy"].values()),
             "tokens/cycle, draft     " + "  ".join(f"{v:6.3f}" for v in d["tokens_per_cycle_greedy"].values()),
             "",
             f"draft model (models/draft), measured here: greedy agreement {d['greedy_agreement']:.3f}, "
             f"T=1 acceptance {d['t1_acceptance']:.3f}"]
    if shipped:
        lines.append(f"draft model, models/results.json: greedy agreement {shipped['greedy_agreement']:.3f}, "
                     f"T=1 acceptance {shipped['sampled_acceptance']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=BUDGETS, default="cpu")
    parser.add_argument("--steps", type=int, help="training steps (default: the budget's)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: the budget's)")
    parser.add_argument("--window", type=int, help="training window, tokens (default: the budget's)")
    parser.add_argument("--pool", type=int, help="continuations to generate (default: the budget's)")
    parser.add_argument("--taps", default="1,3,6",
                        help="three target layers, vLLM's numbering: the hidden state entering layer j, j = L the "
                             "last layer's output (default 1,3,6)")
    parser.add_argument("--draft-vocab", type=int, default=2048, help="draft vocabulary size (4096: the whole)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", type=Path, default=ROOT / "models" / "target")
    parser.add_argument("--draft", type=Path, default=ROOT / "models" / "draft")
    parser.add_argument("--out", type=Path, help="the head's directory (default models/head; smoke: a temp dir)")
    parser.add_argument("--results", type=Path, help="default models/head_results.json (smoke: in the temp dir)")
    parser.add_argument("--work", type=Path, default=ROOT / ".tandem" / "build")
    parser.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout.jsonl")
    parser.add_argument("--eval-prompts", type=int, help="held-out prompts to measure on (default: the budget's)")
    parser.add_argument("--reuse", action="store_true", help="reuse the cached corpus tokens and continuations")
    parser.add_argument("--eval-only", action="store_true", help="measure the head already in --out")
    args = parser.parse_args(argv)
    budget = BUDGETS[args.budget]
    budget = replace(budget, **{k: v for k, v in (("steps", args.steps), ("lr", args.lr), ("window", args.window),
                                                  ("pool", args.pool), ("eval_prompts", args.eval_prompts))
                                if v is not None})
    taps = tuple(int(t) for t in args.taps.split(","))
    if args.budget == "smoke":
        scratch = Path(tempfile.mkdtemp(prefix="tandem-head-smoke-"))  # the smoke run's caches too
        args.out, args.results, args.work = (args.out or scratch / "head", args.results or scratch / "results.json",
                                             scratch)
    args.out = args.out or ROOT / "models" / "head"
    args.results = args.results or ROOT / "models" / "head_results.json"
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    target.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"]
               for p in load_prompts(args.prompts)[:budget.eval_prompts]]
    results: dict = {}
    if args.eval_only:
        head = head_module.load(args.out, target.config)
        if args.results.exists():
            results = json.loads(args.results.read_text())
    else:
        files = training_files(budget.files)
        stream = cached(args.work / "head_corpus.pt", {"files": len(files), "tokenizer": str(args.target)}, args.reuse,
                        lambda: encode(tokenizer, files))
        print(f"corpus: {len(files)} files, {len(stream):,} tokens", flush=True)
        pool = cached(args.work / "head_continuations.pt",
                      {"pool": budget.pool, "window": budget.window, "prompt": budget.prompt, "seed": args.seed,
                       "corpus_tokens": len(stream)}, args.reuse,
                      lambda: continuations(target, stream, budget, args.seed))
        eos = tokenizer.eos_token_id
        with_eos = int((pool[:, budget.prompt:] == eos).any(1).sum())
        print(f"continuations: {tuple(pool.shape)}; EOS in {with_eos} of them", flush=True)
        vocab = target.config.vocab_size
        used = draft_vocabulary(stream, pool, vocab, min(args.draft_vocab, vocab), eos)
        torch.manual_seed(args.seed)
        head = build_head(target, taps, used)
        parameters = sum(p.numel() for p in head.parameters())
        print(f"head: taps {taps}, draft vocab {len(used)}, {parameters:,} parameters", flush=True)

        bar = tqdm(total=budget.steps, desc="train head", unit="step")
        history: list[float] = []

        def progress(step: int, value: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}")

        trained = time.time()
        history = head_training.train(head, target, batches(stream, pool, budget, args.seed + 1), budget.steps,
                                      budget.lr, budget.ttt_steps, progress)
        bar.close()
        train_seconds = time.time() - trained
        save_bf16(head, args.out)
        head = check_saved(head, args.out, target.config)
        results = {
            "budget": args.budget, "seed": args.seed, "shape": asdict(budget), "taps": list(taps),
            "config": head.config.to_dict(), "parameters": parameters,
            "steps": budget.steps, "train_seconds": round(train_seconds, 1),
            "seconds_per_step": round(train_seconds / budget.steps, 3),
            "tokens_trained": budget.steps * budget.batch * budget.window,
            "corpus_tokens": len(stream), "continuations": list(pool.shape),
            "final_loss": history[-1], "final_loss_last20": sum(history[-20:]) / len(history[-20:]),
            "loss_curve": [[i, round(v, 4)] for i, v in enumerate(history) if i % 10 == 0 or i == len(history) - 1],
            "weights_dtype": "bfloat16",
        }
    results["bytes_on_disk"] = sum(f.stat().st_size for f in args.out.iterdir())
    results["eval"] = evaluate(head, target, draft, prompts, budget.eval_new_tokens)
    shipped = ROOT / "models" / "results.json"
    if shipped.exists():
        pair = json.loads(shipped.read_text())
        report = pair["drafts"][pair["shipped"]]
        results["shipped_draft"] = {k: report[k] for k in ("greedy_agreement", "sampled_acceptance", "cost_ratio")}
    results["minutes_eval_only" if args.eval_only else "minutes_total"] = round((time.time() - started) / 60, 1)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"wrote {args.out} and {args.results} in {round((time.time() - started) / 60, 1)} min", flush=True)


if __name__ == "__main__":
    main()
