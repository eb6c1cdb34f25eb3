"""Write benchmarks/prompts/heldout.jsonl: function headers from third-party code, seeded.

    .venv/bin/python benchmarks/make_prompts.py [--n 64] [--seed 0] [--out FILE_OR_DIR] [--smoke]

Third-party code (site-packages) is never in the training corpus, so these prompts measure
acceptance on code the pair has not seen. The file is committed; rerunning this against
other package versions gives other prompts. `--smoke` writes 2 prompts to heldout.jsonl in the
folder --out names.
"""

import argparse
import json
from pathlib import Path

from tandem.bench.corpus import function_prompts, thirdparty_files

OUT = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"


def destination(out: Path, name: str = OUT.name) -> Path:
    """--out's file: the path itself, or `name` in it where it names a folder (one that exists,
    or a path without a suffix, made here)."""
    if out.is_dir() or not out.suffix:
        out.mkdir(parents=True, exist_ok=True)
        return out / name
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help=f"the file to write, or a folder for {OUT.name} (default: {OUT})")
    parser.add_argument("--smoke", action="store_true", help="2 prompts, to the folder --out names")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the committed prompts
        parser.error("--smoke writes only to a folder given with --out")
    out = destination(args.out or OUT)
    prompts = function_prompts(thirdparty_files(), 2 if args.smoke else args.n, args.seed)
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} prompts to {out}")


if __name__ == "__main__":
    main()
