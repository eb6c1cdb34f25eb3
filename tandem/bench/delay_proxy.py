"""The test bed's network links: a user-space TCP relay that delays what crosses it (the kernel
here has no netem).

A link listens on one address and relays each connection to one target. Every chunk read, in
either direction, is written on one-way delay (plus jitter) after it was read, and never before
the chunk ahead of it: a TCP stream keeps its order, so jitter stretches gaps but cannot reorder.
A link can drop its connections (both sides reset, as when a cable or a node goes) and can be
down (new connections are reset at once) until it is up again.

Run as a process, it takes its commands on stdin, one per line, for one link or all (`*`):

    delay NAME|* MS [JITTER_MS]     drop NAME|*     down NAME|*     up NAME|*

    python -m tandem.bench.delay_proxy --link draft=10.0.0.1:7001,10.0.1.2:50051 --delay-ms 5
"""

import argparse
import asyncio
import random
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

CHUNK = 1 << 16


@dataclass
class Delay:
    """What a link adds to each chunk, in milliseconds: delay ± jitter (uniform), never below 0."""

    ms: float = 0.0
    jitter_ms: float = 0.0

    def sample(self, rng: random.Random) -> float:
        return max(0.0, self.ms + rng.uniform(-self.jitter_ms, self.jitter_ms)) / 1e3


class Link:
    """One link: listen → target, with a delay both ways."""

    def __init__(self, name: str, listen: tuple[str, int], target: tuple[str, int], delay: Delay,
                 seed: int = 0) -> None:
        self.name, self.listen, self.target, self.delay = name, listen, target, delay
        self.rng = random.Random(seed)
        self.is_down = False
        self.connections: set[asyncio.StreamWriter] = set()  # both sides of each relayed connection
        self.relays: set[asyncio.Task] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> "Link":
        self.server = await asyncio.start_server(self._accept, *self.listen, reuse_address=True)
        self.listen = self.server.sockets[0].getsockname()[:2]  # port 0 → the port taken
        return self

    def drop(self) -> None:
        """Reset every connection now (the peers see a reset, not an orderly close)."""
        for writer in list(self.connections):
            _reset(writer)
        self.connections.clear()

    async def close(self) -> None:
        if self.server:
            self.server.close()
        self.drop()
        for task in self.relays:
            task.cancel()
        await asyncio.gather(*self.relays, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.is_down:
            _reset(client_w)
            return
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(client_w)
            return
        for w in (client_w, target_w):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = {client_w, target_w}
        self.connections |= pair
        relay = asyncio.current_task()
        self.relays.add(relay)
        try:
            await asyncio.gather(self._pipe(client_r, target_w), self._pipe(target_r, client_w))
        except asyncio.CancelledError:
            pass  # the link closed
        finally:
            self.relays.discard(relay)
            for w in pair:
                if w in self.connections:
                    self.connections.discard(w)
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay one direction: a reader task stamps each chunk with its due time, this one writes
        it then (chunks in order: each is due no earlier than the one before)."""
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            due = 0.0
            try:
                while data := await reader.read(CHUNK):
                    due = max(due, time.monotonic() + self.delay.sample(self.rng))
                    chunks.put_nowait((due, data))
            except OSError:
                pass
            chunks.put_nowait((0.0, b""))  # end of stream

        reading = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await chunks.get()
                if not data:
                    break
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            pass
        finally:
            reading.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0): the peer's next read fails at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # on, 0 s
        except OSError:
            pass
    writer.transport.abort()


def apply(links: dict[str, Link], line: str) -> str:
    """One stdin command → its answer ("ok ..." or "error ...")."""
    words = line.split()
    if not words:
        return "error: an empty command"
    verb, names = words[0], words[1:2]
    chosen = list(links.values()) if names == ["*"] else [links[n] for n in names if n in links]
    if not chosen:
        return f"error: no link {' '.join(names) or '(none named)'}"
    try:
        for link in chosen:
            if verb == "delay":
                link.delay = Delay(float(words[2]), float(words[3]) if len(words) > 3 else 0.0)
            elif verb == "drop":
                link.drop()
            elif verb in ("down", "up"):
                link.is_down = verb == "down"
                if link.is_down:
                    link.drop()
            else:
                return f"error: unknown command {verb!r} (delay, drop, down, up)"
    except (IndexError, ValueError):
        return f"error: {line.strip()!r}: delay NAME MS [JITTER_MS]"
    return f"ok {line.strip()}"


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def parse_link(text: str) -> tuple[str, tuple[str, int], tuple[str, int]]:
    """"NAME=LISTEN_HOST:PORT,TARGET_HOST:PORT" → (name, listen, target)."""
    name, _, rest = text.partition("=")
    listen, _, target = rest.partition(",")
    if not (name and listen and target):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=LISTEN_HOST:PORT,TARGET_HOST:PORT")
    return name, _address(listen), _address(target)


async def serve(specs: list, delay: Delay, seed: int) -> None:
    links = {name: await Link(name, listen, target, Delay(delay.ms, delay.jitter_ms), seed + i).start()
             for i, (name, listen, target) in enumerate(specs)}
    for link in links.values():
        print(f"link {link.name} listening on {link.listen[0]}:{link.listen[1]} → "
              f"{link.target[0]}:{link.target[1]}", flush=True)
    print("ready", flush=True)
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():  # stdin closed: the test bed is gone
        print(apply(links, line.decode()), flush=True)
    await asyncio.gather(*(link.close() for link in links.values()))


class ProxyProcess:
    """This module run as a process of its own, driven through its stdin: the links `specs`
    ("NAME=LISTEN_HOST:PORT,TARGET_HOST:PORT", port 0 for a free one) → `links`, {name: the
    address it listens on}."""

    def __init__(self, specs: list[str], delay_ms: float = 0.0, jitter_ms: float = 0.0, seed: int = 0) -> None:
        cmd = [sys.executable, "-m", "tandem.bench.delay_proxy", "--delay-ms", str(delay_ms),
               "--jitter-ms", str(jitter_ms), "--seed", str(seed), *(a for spec in specs for a in ("--link", spec))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.links: dict[str, str] = {}
        for line in self.proc.stdout:
            if line.startswith("link "):  # "link NAME listening on HOST:PORT → ..."
                self.links[line.split()[1]] = line.split()[4]
            elif line.strip() == "ready":
                return
        raise RuntimeError(f"the delay proxy exited with {self.proc.wait()} before it was ready")

    def command(self, line: str) -> None:
        """One of the commands above (`delay NAME|* MS [JITTER]`, `drop`, `down`, `up`); ValueError
        with the proxy's answer unless it is ok."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise ValueError(f"delay proxy: {answer or 'no answer'}")

    def set_delay(self, ms: float, jitter_ms: float = 0.0, link: str = "*") -> None:
        self.command(f"delay {link} {ms} {jitter_ms}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", type=parse_link, action="append", required=True,
                        help="NAME=LISTEN_HOST:PORT,TARGET_HOST:PORT (repeat for more links)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of every link")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="± this, uniform, per chunk")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.link, Delay(args.delay_ms, args.jitter_ms), args.seed))


if __name__ == "__main__":
    main()
