#!/usr/bin/python3
"""An outside client that holds idle TCP connections to a listener: never sends a byte, and opens
a new connection for each one the server drops (REFUSE, close or reset), as fast as it can.

Usage: idle_flood.py HOST:PORT SOURCE_ADDRESS[,SOURCE_ADDRESS...] CONNECTIONS_PER_SOURCE

Prints "holding N" once every connection was opened the first time, then runs until SIGTERM or
SIGINT and prints one JSON line: {"opened", "dropped", "holding", "max_holding_after_start"}.
"""
import errno
import json
import selectors
import signal
import socket
import sys


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    target = (host, int(port))
    sources = sys.argv[2].split(",")
    per_source = int(sys.argv[3])
    selector = selectors.DefaultSelector()
    stats = {"opened": 0, "dropped": 0, "connect_errors": 0}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    def open_one(source):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((source, 0))
            s.setblocking(False)
            err = s.connect_ex(target)
        except OSError as e:  # out of local ports
            err = e.errno
        if err not in (0, errno.EINPROGRESS):
            stats["connect_errors"] += 1
            s.close()
            return False
        stats["opened"] += 1
        selector.register(s, selectors.EVENT_READ, source)
        return True

    for source in sources:
        for _ in range(per_source):
            open_one(source)
    print(f"holding {len(selector.get_map())}", flush=True)
    while not stop:
        for key, _ in selector.select(timeout=0.5):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                continue  # a REFUSE: the server closes next
            # Dropped by the server (or never connected): open another in its place.
            selector.unregister(s)
            s.close()
            stats["dropped"] += 1
            if not open_one(key.data):
                # A full accept queue or out of ports: try again on the next turn.
                selector.select(timeout=0.05)
                open_one(key.data)
    stats["holding"] = len(selector.get_map())
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
