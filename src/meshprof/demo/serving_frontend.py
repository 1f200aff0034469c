"""The serving demo's frontend: a process of its own between the client and the driver rank, as
vLLM's API server is between its clients and its engine.

It accepts the client's connection, and relays both ways: each request to the driver with the
time it arrived (its clock reading the moment the request was read: the request's arrival time,
vLLM's ``arrival_time``), each message of tokens from the driver to the client. It does nothing
else, so it reads a request as soon as it comes, whatever the ranks are computing.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection, Listener, wait
from typing import cast


def _accept(listener: Listener, timeout_s: float) -> Connection | None:
    import threading

    from meshprof.demo.serving_client import no_delay

    got: list[Connection] = []
    with listener:
        t = threading.Thread(target=lambda: got.append(no_delay(listener.accept())), daemon=True)
        t.start()
        t.join(timeout_s)
    return got[0] if got else None


def frontend_main(
    client_at: tuple[str, int], engine_at: tuple[str, int], authkey: bytes, timeout_s: float
) -> int:
    """Serve one client at ``client_at`` for the driver that connects at ``engine_at`` (port 0:
    one the system picks). Both are listened on before anything else, and the line
    ``ports CLIENT ENGINE`` printed (the ports bound: nobody else can take them meanwhile)."""
    at_client = Listener(client_at, authkey=authkey)
    at_engine = Listener(engine_at, authkey=authkey)
    ports = (
        cast(tuple[str, int], at_client.address)[1],
        cast(tuple[str, int], at_engine.address)[1],
    )
    print(f"ports {ports[0]} {ports[1]}", flush=True)
    engine = _accept(at_engine, timeout_s)
    if engine is None:
        at_client.close()
        return 1
    client = _accept(at_client, timeout_s)
    if client is None:
        engine.send(("done",))
        return 1
    client_open = True
    while True:
        ready = wait([client, engine] if client_open else [engine])
        for got in ready:
            conn = cast(Connection, got)
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                if conn is engine:
                    client.close()
                    return 0
                client_open = False
                engine.send(("done",))
                continue
            if conn is client:
                arrival = time.time_ns()
                if msg[0] == "request":
                    engine.send((*msg, arrival))
                else:
                    engine.send(msg)
                    if msg[0] == "done":
                        client_open = False
            elif msg[0] == "close":
                client.close()
                return 0
            else:
                client.send(msg)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m meshprof.demo.serving_frontend")
    p.add_argument("--client", required=True, help="HOST:PORT the client connects to")
    p.add_argument("--engine", required=True, help="HOST:PORT the driver rank connects to")
    p.add_argument("--authkey", default="meshprof-serve")
    p.add_argument("--timeout", type=float, default=120.0)
    a = p.parse_args(argv)
    return frontend_main(_address(a.client), _address(a.engine), a.authkey.encode(), a.timeout)


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["frontend_main", "main"]
