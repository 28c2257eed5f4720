"""The trainer's HTTP server, held to what floe's Rust servers are held to (``serve_limited``).

Sandbox pods reach the trainer's ingest port, and the agent shares its pod's address with its
gateway: without limits, its connections sending request heads a byte at a time, each head
up to 100 header lines of 64 KiB, held a thread and megabytes each for as long as it liked,
until the trainer ran out of memory (and, restarted, lost the steps since its checkpoint).

- A request head must arrive whole within ``HEAD_SECONDS`` (an idle keep-alive connection is
  closed then too; floe's clients let go of theirs sooner), and be at most ``HEAD_BYTES``
  (431 past it).
- One peer (an address) holds at most ``PER_PEER`` connections that no request has vouched
  for (a request carrying a token of the server's: the gateways' ingest token, the
  operator's control token); half a second after it goes past that, its oldest such
  connections are closed, so an agent holding its pod's share cannot keep out its own
  gateway's posts. At most ``TOTAL`` connections in all: others wait in the backlog.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
import socket
import threading
import time
from collections import OrderedDict
from http.server import ThreadingHTTPServer

log = logging.getLogger(__name__)

HEAD_SECONDS = 30.0
HEAD_BYTES = 64 * 1024
PER_PEER = 64
TOTAL = 4096
EVICTION_GRACE = 0.5


class HeadLimited(io.RawIOBase):
    """A request's reader whose lines (the head) draw on a budget of bytes; ``read`` (a body)
    does not."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.budget = HEAD_BYTES

    def readable(self) -> bool:
        return True

    def readline(self, size: int = -1) -> bytes:
        if self.budget <= 0:
            # http.server answers it 431 (a header line too long).
            raise http.client.LineTooLong(f"request head over {HEAD_BYTES} bytes")
        size = self.budget if size is None or size < 0 else min(size, self.budget)
        line = self.inner.readline(size)
        self.budget -= len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        return self.inner.read(size)

    def close(self) -> None:
        self.inner.close()
        super().close()


class LimitedServer(ThreadingHTTPServer):
    daemon_threads = True
    # Connections past ``TOTAL`` wait here, not accepted.
    request_queue_size = 1024

    def __init__(self, address, handler) -> None:
        super().__init__(address, handler)
        self._room = threading.Condition()
        self._total = 0
        # Per peer, its connections no request vouched for, oldest first, and since when.
        self._unvouched: dict[str, OrderedDict[socket.socket, float]] = {}
        # Connections reading a request head, and by when it must be whole.
        self._heads: dict[socket.socket, float] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._reap, name="http-limits", daemon=True).start()

    def get_request(self):
        # A slot first, then the accept: past ``TOTAL`` a connection waits in the backlog.
        with self._room:
            if not self._room.wait_for(lambda: self._total < TOTAL, timeout=0.5):
                raise OSError("no room: the connection waits in the backlog")
            self._total += 1
        try:
            return super().get_request()
        except BaseException:
            self._release(None, None)
            raise

    def process_request(self, request, client_address) -> None:
        peer = client_address[0]
        with self._room:
            self._unvouched.setdefault(peer, OrderedDict())[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            # No thread to serve it (a pids limit): its slot is given back here.
            self._release(request, peer)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request, client_address[0])

    def _release(self, request, peer) -> None:
        with self._room:
            self._total -= 1
            self._heads.pop(request, None)
            mine = self._unvouched.get(peer)
            if mine is not None:
                mine.pop(request, None)
                if not mine:
                    del self._unvouched[peer]
            self._room.notify()

    def vouch(self, request, peer: str) -> None:
        """A request on ``request`` carried the server's token: it leaves its peer's share."""
        with self._room:
            mine = self._unvouched.get(peer)
            if mine is not None:
                mine.pop(request, None)

    def head_started(self, request) -> None:
        with self._room:
            self._heads[request] = time.monotonic() + HEAD_SECONDS

    def head_done(self, request) -> None:
        with self._room:
            self._heads.pop(request, None)

    def _reap(self) -> None:
        """Every quarter second: heads past their deadline are cut, and a peer past its share
        loses its oldest connections no request vouched for, those accepted at least
        ``EVICTION_GRACE`` ago (a gateway's connection accepted in a burst behind the agent's
        has that long to send its head and vouch). Closed under the lock, so a connection that
        vouches meanwhile is never closed."""
        while not self._closed.wait(min(0.25, HEAD_SECONDS / 4)):
            now = time.monotonic()
            with self._room:
                for conn in [c for c, by in self._heads.items() if by < now]:
                    del self._heads[conn]
                    _close(conn)
                for mine in self._unvouched.values():
                    while len(mine) > PER_PEER:
                        oldest, since = next(iter(mine.items()))
                        if now - since < EVICTION_GRACE:
                            break
                        del mine[oldest]
                        _close(oldest)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def handle_error(self, request, client_address) -> None:
        # A connection cut (a head past its deadline, a peer gone): no traceback on stderr.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _close(conn: socket.socket) -> None:
    """Ends a connection another thread serves: its blocked read returns, and it is let go."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
