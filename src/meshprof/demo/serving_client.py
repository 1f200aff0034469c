"""The serving demo's load generator, a process of its own with its own clock readings.

``python -m meshprof.demo.serving_client --address HOST:PORT --out client.json [...]`` sends
``--requests`` requests as a Poisson stream (``--rate`` per second) with prompt and output
lengths drawn uniformly from ``--prompt`` and ``--output`` ranges (all from ``--seed``), and
reads the tokens streamed back. It takes its own timestamps (``time.time_ns()``) when it sends
each request and when each token reaches it, and writes them, untouched, to ``--out`` (JSON):
``requests``: ``[{"id", "prompt_tokens", "max_tokens", "sent_ns", "token_ns": [...],
"reason"}]``. Nothing of meshprof's analysis runs here: a test computes TTFT, ITL, TPOT and E2E
from these timestamps with its own code and compares.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Load:
    """The request stream."""

    requests: int = 40
    """Requests sent."""
    rate: float = 20.0
    """Mean requests per second (Poisson arrivals)."""
    prompt: tuple[int, int] = (8, 40)
    """Prompt lengths, drawn uniformly (tokens, both ends included)."""
    output: tuple[int, int] = (4, 24)
    """Output lengths asked for (tokens, both ends included)."""
    seed: int = 0
    """Seed of the arrivals, the lengths and the prompt tokens."""
    vocab: int = 256
    """Prompt tokens are drawn from 1 .. vocab − 1."""

    def plan(self) -> list[tuple[float, int, list[int], int]]:
        """(seconds after the start, id, prompt, max tokens) of every request."""
        rng = random.Random(self.seed)
        t = 0.0
        out = []
        for rid in range(self.requests):
            t += rng.expovariate(self.rate)
            n = rng.randint(*self.prompt)
            prompt = [rng.randint(1, self.vocab - 1) for _ in range(n)]
            out.append((t, rid, prompt, rng.randint(*self.output)))
        return out


@dataclass(slots=True)
class _Request:
    rid: int
    prompt_tokens: int
    max_tokens: int
    sent_ns: int = -1
    token_ns: list[int] = field(default_factory=list)
    reason: str = ""


def no_delay(conn: Any) -> Any:
    """``conn`` (a ``multiprocessing.connection`` over TCP) with Nagle's algorithm off, as
    serving stacks set their sockets (uvicorn, gRPC): a small message is sent at once, not held
    until the peer acknowledges the one before, which the peer's delayed acknowledgement can
    hold up to 40 ms (measured here: a request sent 2–20 ms after another reached the frontend
    26–42 ms late). Returns ``conn``."""
    s = socket.socket(fileno=os.dup(conn.fileno()))  # (the option belongs to the socket)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    finally:
        s.close()
    return conn


def connect(address: tuple[str, int], authkey: bytes, timeout_s: float) -> Any:
    """A connection to the server, retried until it listens (or ``timeout_s`` passed), with
    Nagle's algorithm off (:func:`no_delay`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return no_delay(Client(address, authkey=authkey))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_client(
    address: tuple[str, int], authkey: bytes, load: Load, timeout_s: float = 300.0
) -> list[dict[str, Any]]:
    """Send the load, read the tokens back; every request's timestamps (see the module
    docstring)."""
    conn = connect(address, authkey, timeout_s)
    plan = load.plan()
    reqs = {rid: _Request(rid, len(p), m) for _, rid, p, m in plan}

    def send() -> None:
        start = time.monotonic()
        for offset, rid, prompt, max_tokens in plan:
            delay = start + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            reqs[rid].sent_ns = time.time_ns()
            conn.send(("request", rid, prompt, max_tokens))
        conn.send(("done",))

    sender = threading.Thread(target=send, name="client-send", daemon=True)
    sender.start()
    left = len(reqs)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        if not conn.poll(1.0):
            continue
        try:
            msg = conn.recv()
        except EOFError:
            break
        now = time.time_ns()
        if msg[0] != "tokens":
            continue
        for rid, _tok, reason in msg[1]:
            r = reqs[rid]
            r.token_ns.append(now)
            if reason:
                r.reason = reason
                left -= 1
    sender.join(timeout=5.0)
    conn.close()
    return [
        {
            "id": r.rid,
            "prompt_tokens": r.prompt_tokens,
            "max_tokens": r.max_tokens,
            "sent_ns": r.sent_ns,
            "token_ns": r.token_ns,
            "reason": r.reason,
        }
        for r in reqs.values()
    ]


def _range(text: str) -> tuple[int, int]:
    a, _, b = text.partition(":")
    return int(a), int(b or a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m meshprof.demo.serving_client")
    p.add_argument("--address", required=True, help="HOST:PORT of the server")
    p.add_argument("--authkey", default="meshprof-serve")
    p.add_argument("--out", required=True, help="JSON file of the client's timestamps")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--prompt", type=_range, default=(8, 40), help="MIN:MAX prompt tokens")
    p.add_argument("--output", type=_range, default=(4, 24), help="MIN:MAX output tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args(argv)
    host, _, port = a.address.rpartition(":")
    load = Load(a.requests, a.rate, a.prompt, a.output, a.seed, a.vocab)
    got = run_client((host, int(port)), a.authkey.encode(), load, a.timeout)
    Path(a.out).write_text(json.dumps({"load": vars(a) | {"prompt": a.prompt, "output": a.output},
                                       "requests": got}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
