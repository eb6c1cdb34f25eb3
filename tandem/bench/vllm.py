"""vLLM's CPU build as a peer of the cluster: its OpenAI server started from its own virtual
environment, driven over HTTP with the same token ids, and timed into the same `Run` records as
tandem's sessions, so that tokens/s, TTFT and ITL come from one set of definitions.

vLLM is never imported here: it pins its own torch and transformers, which must not meet
tandem's, so it lives in a separate virtual environment and only its server's HTTP API is used.
Process accounting reads /proc (tandem.bench.procfs), for the server and every process it forks."""

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tandem.bench.procfs import command_line, descendants
from tandem.bench.runs import Run
from tandem.ports import free_port

START_TIMEOUT_S = 600.0  # a cold start on 2 cores takes about a minute; the draft model adds more
STOP_TIMEOUT_S = 20.0


# --- the server -------------------------------------------------------------------------------


@dataclass
class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` from `venv` on a free loopback port, the
    target alone or with `draft` as its draft model; a context manager that starts it, waits for
    /v1/models, and stops its whole process group on exit. Its log goes to `log_path`.

    threads_bind: VLLM_CPU_OMP_THREADS_BIND ("auto", which on 2 cores leaves one core to the
    API server and computes on the other, or core ids such as "0-1"). preload: libraries for
    LD_PRELOAD (see preload_libraries)."""

    venv: str
    target: str
    log_path: str
    draft: str | None = None
    num_speculative_tokens: int = 3
    max_num_seqs: int = 64
    max_model_len: int = 1024
    kv_cache_gib: int = 2
    threads_bind: str = "auto"
    preload: tuple[str, ...] = ()  # LD_PRELOAD: vLLM's CPU guide asks for tcmalloc and Intel's OpenMP
    extra_args: tuple[str, ...] = ()
    start_timeout_s: float = START_TIMEOUT_S
    host: str = "127.0.0.1"
    port: int = 0
    startup_s: float | None = None  # seconds from spawn to a first answer of /v1/models
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        # Not `vllm serve`: the CLI asks for the distribution "vllm", and the CPU build is "vllm-cpu".
        cmd = [str(Path(self.venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
               "--model", self.target, "--host", self.host, "--port", str(self.port), "--dtype", "float32",
               "--enforce-eager", "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs), "--seed", "0", "--disable-log-stats",
               "--disable-uvicorn-access-log",
               "--generation-config", "vllm",  # vLLM's neutral sampling defaults, not the model's file
               # The bench repeats its prompts across levels: cached prefills would be a gift
               # that distinct prompts do not get (and tandem caches no prefixes).
               "--no-enable-prefix-caching"]
        if self.draft:
            spec = {"method": "draft_model", "model": self.draft, "num_speculative_tokens": self.num_speculative_tokens}
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """No hub (the models are local directories), the KV cache size, the thread binding, the
        preloaded libraries; no PYTHONPATH, which would mix this environment's packages into vLLM's."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env |= {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": self.threads_bind, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if self.preload:
            env["LD_PRELOAD"] = ":".join([*self.preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
        return env

    def start(self) -> "VllmServer":
        self.port = self.port or free_port(self.host)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            # A session of its own: stop() signals the whole group, EngineCore and workers included.
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.environment(), start_new_session=True)
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started
        return self

    def _wait_ready(self, started: float) -> None:
        """Poll /v1/models until it answers; RuntimeError with the log's tail if the server exits
        or the timeout passes first."""
        while time.perf_counter() - started < self.start_timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode} while starting; "
                                   f"the end of {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server did not answer /v1/models within {self.start_timeout_s:.0f} s; "
                           f"the end of {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self) -> dict[int, str]:
        """The server and all its descendants now alive → a name for each: API server,
        EngineCore, worker, or the command line's start."""
        if self.proc is None or self.proc.poll() is not None:
            return {}
        return {pid: vllm_process_name(pid, pid == self.proc.pid)
                for pid in [self.proc.pid, *descendants(self.proc.pid)]}

    def stop(self) -> None:
        """SIGTERM the server's process group (the server's pid is its id), then SIGKILL what
        outlives STOP_TIMEOUT_S."""
        if self.proc is None:
            return
        group = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            if _group_gone(group, self.proc, wait_s):
                break
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def preload_libraries(venv: str) -> list[str]:
    """The libraries vLLM's CPU guide preloads, where this machine has them: tcmalloc (Debian's
    libtcmalloc-minimal4) and Intel's OpenMP (the intel-openmp wheel in the virtual
    environment; without it vLLM warns that speculative decoding loses much of its speed)."""
    candidates = [*Path("/usr/lib").glob("*/libtcmalloc_minimal.so.4"), Path("/usr/lib/libtcmalloc_minimal.so.4"),
                  Path(venv) / "lib" / "libiomp5.so"]
    found = [str(p) for p in candidates if p.exists()]
    return [p for p in found if "tcmalloc" in p][:1] + [p for p in found if "iomp5" in p]


def _group_gone(group: int, proc: subprocess.Popen, wait_s: float) -> bool:
    """Wait up to wait_s for every process of the group to exit (reaping the leader)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def vllm_process_name(pid: int, is_server: bool = False) -> str:
    """A readable name for one of vLLM's processes (they retitle themselves VLLM::…)."""
    if is_server:
        return "API server"
    cmd = command_line(pid)
    if cmd.startswith("VLLM::"):
        return cmd.removeprefix("VLLM::").split()[0]
    if "resource_tracker" in cmd:
        return "multiprocessing resource tracker"
    return cmd[:60]


# --- requests ---------------------------------------------------------------------------------


@dataclass
class Completion:
    """One streamed completion: when it was sent, and each chunk's tokens and arrival
    (time.perf_counter() seconds)."""

    sent_s: float
    token_ids: list[int] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    done_s: float | None = None
    usage: dict | None = None

    def run(self, mode: str, workload: str, index: int) -> Run:
        """As tandem's runs are timed: arrivals and wall since the call."""
        return Run(mode, workload, index, self.token_ids, (self.done_s or self.sent_s) - self.sent_s,
                   [t - self.sent_s for t in self.arrivals_s], self.sizes)


async def stream_completion(session: aiohttp.ClientSession, url: str, prompt_ids: list[int], max_tokens: int,
                            temperature: float, seed: int) -> Completion:
    """POST /v1/completions with token ids as the prompt and stream it; the ids of each chunk
    come from `return_token_ids`. EOS ends a generation as it does tandem's (no ignore_eos), and
    vLLM's token ids then hold the EOS token, as tandem's do."""
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    completion = Completion(time.perf_counter())
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"vLLM answered {response.status}: {(await response.text())[:500]}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            _add_chunk(completion, json.loads(line[6:]), time.perf_counter())
    completion.done_s = time.perf_counter()
    return completion


def _add_chunk(completion: Completion, chunk: dict, now: float) -> None:
    if chunk.get("usage"):
        completion.usage = chunk["usage"]
    for choice in chunk.get("choices", []):
        ids = choice.get("token_ids") or []
        if ids:
            completion.token_ids.extend(ids)
            completion.arrivals_s.append(now)
            completion.sizes.append(len(ids))
        completion.finish_reason = choice.get("finish_reason") or completion.finish_reason


def run_level(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int, temperature: float = 0.0,
              seed: int = 0, mode: str = "vllm") -> tuple[list[Run], float]:
    """Every prompt with at most `concurrency` requests in flight, as
    tandem.bench.runs.concurrent_runs does for the cluster (prompt i gets seed + i) →
    (runs, wall seconds of the whole level)."""
    workload = "greedy" if temperature == 0 else "sampled"

    async def one(session, gate, i, prompt) -> Run:
        async with gate:
            completion = await stream_completion(session, url, prompt, max_tokens, temperature, seed + i)
            return completion.run(mode, workload, i)

    async def main() -> tuple[list[Run], float]:
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        connector = aiohttp.TCPConnector(limit=max(concurrency, 1))
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            start = time.perf_counter()
            runs = await asyncio.gather(*(one(session, gate, i, p) for i, p in enumerate(prompts)))
            return list(runs), time.perf_counter() - start

    return asyncio.run(main())
