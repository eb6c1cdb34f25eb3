"""Write benchmarks/prompts/repetition.jsonl: a repetition-heavy workload built from the held-out
code, where the prompt contains most of its answer ("rewrite this code with X renamed").

    .venv/bin/python benchmarks/make_repetition_prompts.py [--source FILE] [--out FILE_OR_DIR] [--smoke]

Each prompt is a held-out snippet, a comment asking for it again with its most frequent
identifier renamed, and the first third of the rewritten snippet: a model that copies continues
with the rest of it, which an n-gram lookup in the context can propose. The file is committed.
`--smoke` writes the first 2 snippets' prompts to repetition.jsonl in the folder --out names.
"""

import argparse
import json
import keyword
import re
from collections import Counter
from pathlib import Path

from make_prompts import destination  # beside this script in benchmarks/

HERE = Path(__file__).resolve().parent / "prompts"
OUT = HERE / "repetition.jsonl"
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")


def rewrite_prompt(code: str) -> str:
    """The code, the request to rewrite it with a name changed, and the rewrite's first third."""
    names = Counter(n for n in IDENTIFIER.findall(code) if not keyword.iskeyword(n) and n not in ("self", "None"))
    name = names.most_common(1)[0][0] if names else "value"
    renamed = re.sub(rf"\b{re.escape(name)}\b", f"new_{name}", code)
    return f"{code}\n\n# The same code, with `{name}` renamed to `new_{name}`:\n{renamed[: len(renamed) // 3]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=HERE / "heldout.jsonl")
    parser.add_argument("--out", type=Path, help=f"the file to write, or a folder for {OUT.name} (default: {OUT})")
    parser.add_argument("--smoke", action="store_true", help="the first 2 snippets, to the folder --out names")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the committed prompts
        parser.error("--smoke writes only to a folder given with --out")
    rows = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
    rows = rows[:2] if args.smoke else rows
    out = [{"source": r.get("source", ""), "prompt": rewrite_prompt(r["prompt"])} for r in rows]
    path = destination(args.out or OUT, OUT.name)
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"wrote {len(out)} prompts to {path}")


if __name__ == "__main__":
    main()
