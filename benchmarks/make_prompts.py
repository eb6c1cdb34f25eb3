"""Write benchmarks/prompts/heldout.jsonl: function headers from third-party code, seeded.

    .venv/bin/python benchmarks/make_prompts.py [--n 64] [--seed 0]

Third-party code (site-packages) is never in the training corpus, so these prompts measure
acceptance on code the pair has not seen. The file is committed; rerunning this against
other package versions gives other prompts.
"""

import argparse
import json
from pathlib import Path

from tandem.bench.corpus import function_prompts, thirdparty_files

OUT = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    prompts = function_prompts(thirdparty_files(), args.n, args.seed)
    args.out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} prompts to {args.out}")


if __name__ == "__main__":
    main()
