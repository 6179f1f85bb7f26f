"""A client for the network-cut test: ``python -m tests.fault.workers.echo_client PORT``.

Sends one byte to 127.0.0.1:PORT every 0.2 s on one connection and prints ``echo`` when the
byte comes back within 1 s, ``timeout`` when it does not (a byte sent into a cut arrives once
the cut heals, so a late echo may answer an earlier byte: that still prints ``echo``).
"""

from __future__ import annotations

import socket
import sys
import time


def main() -> None:
    conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5.0)
    conn.settimeout(1.0)
    while True:
        conn.sendall(b"x")
        try:
            print("echo" if conn.recv(64) else "closed", flush=True)
        except TimeoutError:
            print("timeout", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
