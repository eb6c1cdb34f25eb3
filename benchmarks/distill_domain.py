"""A draft distilled by `tandem distill` for a domain the shipped pair never trained on, against
the shipped draft, on that domain.

    .venv/bin/python benchmarks/distill_domain.py [--minutes 10] [--limit 32] [--smoke]
        [--out benchmarks/results/distill_domain]

The domain is third-party Python (site-packages; the shipped target and draft read only the
standard library). `tandem distill` trains a tiny draft (the shipped draft's shape: 1 layer at a
third of the target's width) for the shipped target on the files of the first half of
tandem.bench.corpus.HELDOUT_PACKAGES for --minutes; then `tandem check` measures both drafts
against the target on the held-out prompts (benchmarks/prompts/heldout.jsonl) taken from the
other half, which neither draft read: greedy agreement, T=1 acceptance, the analytic speedup.
Writes distill_domain.json, distill_domain.md and distill_domain.png to --out
(benchmarks/README.md, "Distilled drafts"); the draft itself goes to .tandem/distill_domain/.
`--smoke` runs it all at a tiny size (the first package alone, 10 steps of 4 64-token windows,
8 continuations, 2 prompts, which distill's own check uses too) and writes everything, the draft too
(--out/draft), to --out, or to a scratch folder without one.
"""

import argparse
import json
import sysconfig
import tempfile
from pathlib import Path

from tandem.bench.corpus import HELDOUT_PACKAGES
from tandem.cli import HELDOUT_PROMPTS, default_pair
from tandem.distill import run as distill
from tandem.suitability import check_pair

OUT = Path(__file__).resolve().parent / "results" / "distill_domain"
TRAIN_PACKAGES = HELDOUT_PACKAGES[:len(HELDOUT_PACKAGES) // 2]
METRICS = (("greedy_agreement", "greedy agreement"), ("sampled_acceptance", "T=1 acceptance"),
           ("speedup", "analytic speedup, greedy"), ("speedup_sampled", "analytic speedup, T=1"))


def eval_prompts(limit: int) -> list[str]:
    """The held-out prompts from packages outside TRAIN_PACKAGES."""
    rows = [json.loads(line) for line in Path(HELDOUT_PROMPTS).read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows if r["source"].split("/")[0] not in TRAIN_PACKAGES][:limit]


def plot(reports: dict, curve: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(reports)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(METRICS))]
        axes[0].bar(xs, [reports[name][k] for k, _ in METRICS], width, label=name)
    axes[0].set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(METRICS))],
                       [label for _, label in METRICS], rotation=15, fontsize=8)
    axes[0].set(title="on held-out third-party packages (tandem check)")
    axes[0].legend()
    axes[1].plot([c["step"] for c in curve], [c["kl"] for c in curve], lw=0.6)
    axes[1].set(title="tandem distill: KL(target || draft)", xlabel="step", ylabel="nats/token", yscale="log")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def distill_settings(smoke: bool, minutes: float, out: Path, prompts: list[str]) -> dict:
    """`tandem distill`'s budget, sizes and check prompts: the measuring run's, or --smoke's (its
    own check, too, on the 2 evaluation prompts, written under out)."""
    if not smoke:
        return {"minutes": minutes, "window": 256, "batch": 8, "continuation_count": 64}
    check = out / "check_prompts.jsonl"
    check.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return {"steps": 10, "window": 64, "batch": 4, "continuation_count": 8, "prompts": str(check)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--limit", type=int, default=32, help="held-out prompts to check on")
    parser.add_argument("--smoke", action="store_true", help="a tiny run: 1 package, 10 steps, 2 prompts, all to --out")
    parser.add_argument("--out", type=Path, help="the folder for the results (default: benchmarks/results/"
                        "distill_domain; with --smoke, a scratch folder)")
    args = parser.parse_args()
    out = args.out or (Path(tempfile.mkdtemp(prefix="distill-smoke-")) if args.smoke else OUT)
    out.mkdir(parents=True, exist_ok=True)
    draft, target = default_pair()
    site = Path(sysconfig.get_paths()["purelib"])
    packages = TRAIN_PACKAGES[:1] if args.smoke else TRAIN_PACKAGES
    data = [str(site / p) for p in packages if (site / p).is_dir()]
    prompts = eval_prompts(2 if args.smoke else args.limit)
    drafted = out / "draft" if args.smoke else Path(__file__).resolve().parent.parent / ".tandem" / "distill_domain"
    summary = distill(target, data, str(drafted), "tiny", device="cpu",
                      **distill_settings(args.smoke, args.minutes, out, prompts))
    new_tokens = 8 if args.smoke else 64
    reports = {name: check_pair(path, target, prompts, max_new_tokens=new_tokens).as_dict()
               for name, path in (("shipped draft (stdlib)", draft), ("distilled on the domain", str(drafted)))}
    result = {"train_packages": packages, "eval_prompts": len(prompts), "draft": str(drafted), "distill": {
        k: summary[k] for k in ("steps", "minutes", "final_kl", "parameters", "check")}, "reports": reports}
    (out / "distill_domain.json").write_text(json.dumps(result, indent=2) + "\n")
    write_table(reports, out)
    plot(reports, summary["curve"], out / "distill_domain.png")


def write_table(reports: dict, out: Path) -> None:
    """The drafts' metrics as out/distill_domain.md, and printed."""
    lines = ["| draft | " + " | ".join(label for _, label in METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    lines += [f"| {name} | " + " | ".join(f"{r[k]:.3f}" if k.endswith(("agreement", "acceptance")) else f"{r[k]:.2f}x"
                                           for k, _ in METRICS) + " |" for name, r in reports.items()]
    (out / "distill_domain.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
