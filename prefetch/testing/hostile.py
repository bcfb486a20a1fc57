"""A loopback HTTP server that misbehaves on purpose: the hostile store of the remote tests.

`serve_hostile(routes)` answers each request from `routes` (a mapping of request paths to
`Reply`s, or a function of the path) over a raw socket on 127.0.0.1, so a reply can do what no
well-behaved server does: stall halfway through a page, send a body that never ends, cut a body
short with no Content-Length, redirect anywhere, link out of its folder. Every connection is
one request (`Connection: close`), served by its own thread; every loop in it is bounded by
the server's stop flag and `max_seconds`, and leaving the `with` block stops and joins all of
them. Re-exported from `prefetch.testing`; see tests/test_hostile_remote.py.
"""

from __future__ import annotations

import contextlib
import html
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prefetch.coordinator import Deadline

# Bytes of a request's head the server reads at most (request line and headers).
MAX_REQUEST_HEAD = 64 * 1024
# How often blocked socket calls wake to look at the stop flag.
POLL_S = 0.05
# The chunk an endless body repeats (zeros when the reply's body is empty).
ENDLESS_CHUNK = 64 * 1024

_REASONS = {
    200: "OK",
    301: "Moved Permanently",
    302: "Found",
    307: "Temporary Redirect",
    404: "Not Found",
    500: "Internal Server Error",
}


@dataclass(frozen=True)
class Reply:
    """One answer of `serve_hostile`.

    - `status`, `headers`, `body`: what is sent (`Content-Type` defaults to text/html).
    - `content_length`: send a Content-Length header for `body` (else the body ends when the
      connection closes, as an HTTP/1.0 server's does).
    - `stall_after`: send only this many bytes of the body, then nothing more until the server
      stops (the connection stays open).
    - `endless`: after `body`, send `body` (or zeros) again and again until the client goes
      away or the server stops, waiting `interval_s` before each (a trickle).
    """

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    content_length: bool = True
    stall_after: int | None = None
    endless: bool = False
    interval_s: float = 0.0


def index_page(links: Sequence[str], padding: int = 0) -> Reply:
    """An index page (as `python -m http.server` writes) linking `links`, as given (not quoted:
    a test decides what each href says); `padding` adds that many bytes of filler."""
    items = "".join(f'<li><a href="{html.escape(link, quote=True)}">x</a></li>\n' for link in links)
    filler = "<!--" + "x" * padding + "-->" if padding else ""
    body = f"<html><body><ul>\n{items}</ul>{filler}</body></html>\n".encode()
    return Reply(body=body)


def redirect(location: str, status: int = 302) -> Reply:
    """A redirect to `location` (any URL: another host, another scheme)."""
    return Reply(status=status, headers={"Location": location})


Routes = Mapping[str, Reply] | Callable[[str], Reply | None]


class HostileServer:
    """The running server: `url` is its base (``http://127.0.0.1:PORT/``), `requests` the
    request paths it has been sent, in order (as sent: not decoded, not normalised)."""

    def __init__(self, routes: Routes, max_seconds: float) -> None:
        self._routes = routes
        self._deadline = Deadline(max_seconds)
        self.stopping = threading.Event()
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(POLL_S)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/"
        self._acceptor = threading.Thread(target=self._accept, name="prefetch-hostile-accept")

    def start(self) -> None:
        self._acceptor.start()

    def stop(self) -> None:
        """Stop accepting, end every connection's loop, join every thread."""
        self.stopping.set()
        self._acceptor.join()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()
        self._socket.close()

    def _running(self) -> bool:
        return not self.stopping.is_set() and not self._deadline.expired()

    def _accept(self) -> None:
        while self._running():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="prefetch-hostile-connection"
            )
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _reply_for(self, path: str) -> Reply:
        routes = self._routes
        found = routes.get(path) if isinstance(routes, Mapping) else routes(path)
        return found if found is not None else Reply(status=404, body=b"not found")

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(POLL_S)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD and self._running():
                try:
                    chunk = connection.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                head += chunk
            if b"\r\n\r\n" not in head:
                return
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) < 2:
                return
            path = urllib.parse.urlsplit(parts[1]).path
            with self._lock:
                self.requests.append(path)
            reply = self._reply_for(path)
            with contextlib.suppress(OSError):
                self._send(connection, reply, head_only=parts[0] == "HEAD")

    def _send(self, connection: socket.socket, reply: Reply, head_only: bool) -> None:
        headers = {"Content-Type": "text/html; charset=utf-8", **reply.headers}
        headers["Connection"] = "close"
        if reply.content_length and not reply.endless:
            headers["Content-Length"] = str(len(reply.body))
        lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._send_all(connection, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if head_only:
            return
        body = reply.body if reply.stall_after is None else reply.body[: reply.stall_after]
        self._send_all(connection, body)
        if reply.stall_after is not None:
            while self._running():
                self.stopping.wait(POLL_S)
            return
        chunk = reply.body or bytes(ENDLESS_CHUNK)
        while reply.endless and self._running():
            if reply.interval_s:
                self.stopping.wait(reply.interval_s)
            self._send_all(connection, chunk)

    def _send_all(self, connection: socket.socket, data: bytes) -> None:
        view = memoryview(data)
        while view and self._running():
            try:
                sent = connection.send(view)
            except TimeoutError:
                continue
            view = view[sent:]


@contextlib.contextmanager
def serve_hostile(routes: Routes, *, max_seconds: float = 120.0) -> Iterator[HostileServer]:
    """Serve `routes` on 127.0.0.1 for the `with` block; yield the `HostileServer`.

    `routes` maps a request path (``"/train/"``, as the client sent it) to its `Reply`, or is
    a function of that path returning one (None: 404). After `max_seconds` every loop of the
    server gives up, whatever the client does.
    """
    server = HostileServer(routes, max_seconds)
    server.start()
    try:
        yield server
    finally:
        server.stop()
