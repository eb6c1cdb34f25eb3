"""Where tandem's code comes from: the standard library to train on, third-party code to test on,
and the prompt files made from it (benchmarks/prompts/), read back.

Training sees only the standard library (every Python carries it). Evaluation uses pure-Python
packages installed next to tandem (site-packages), which training never reads.
"""

import json
import random
import re
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
HELDOUT_PACKAGES = ["click", "anyio", "fastapi", "filelock", "fsspec", "h11", "jinja2", "packaging", "redis",
                    "requests", "starlette", "yaml", "attr", "jsonschema", "pydantic", "aiohttp", "tqdm"]
_DEF = re.compile(r"^\s*(async\s+)?def \w+\(.*\).*:\s*$")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not EXCLUDED_DIRS & set(p.relative_to(root).parts[:-1]))


def stdlib_files() -> list[Path]:
    """The standard library's .py files, without its test suites."""
    return _python_files(Path(sysconfig.get_paths()["stdlib"]))


def thirdparty_files(min_chars: int = 2000) -> list[Path]:
    """Held-out code: the listed packages from site-packages, files of at least min_chars."""
    site = Path(sysconfig.get_paths()["purelib"])
    return [f for pkg in HELDOUT_PACKAGES if (site / pkg).is_dir()
            for f in _python_files(site / pkg) if len(read(f)) >= min_chars]


def function_prompts(files: list[Path], n: int, seed: int, context_lines: int = 12,
                     max_chars: int = 600) -> list[dict]:
    """n prompts that end on a one-line `def ...:` header, with up to context_lines lines before it.

    The model's job is then to write the function's body, the usual code-completion request.
    Prompts stop after the colon, not after a newline: byte-level BPE merges a newline with the
    indentation that follows, so a prompt ending in a bare newline forces an unnatural split.
    """
    rng = random.Random(seed)
    site = Path(sysconfig.get_paths()["purelib"])
    candidates = []
    for f in files:
        lines = read(f).splitlines()
        candidates += [(f, lines, i) for i, line in enumerate(lines) if _DEF.match(line) and i + 3 < len(lines)]
    prompts = []
    for f, lines, i in rng.sample(candidates, min(n, len(candidates))):
        head = lines[max(0, i - context_lines):i + 1]
        while len(head) > 1 and len("\n".join(head)) > max_chars:
            head = head[1:]
        prompts.append({"source": f"{f.relative_to(site)}:{i + 1}", "prompt": "\n".join(head)})
    return prompts


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSON-lines file (one {"prompt": "..."} per line, as function_prompts makes
    them) or, otherwise, a text file whose prompts are separated by lines holding only `---`."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".jsonl"):
        prompts = [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    else:
        prompts = [p.strip("\n") for p in text.split("\n---\n") if p.strip()]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
