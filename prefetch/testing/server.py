"""A loopback HTTP server over an image folder, with injected latency and faults.

`serve_folder` stands in for remote storage in tests and benchmarks (no internet): per-request
latency (and more for chosen paths), a bandwidth cap shared by all connections, 500 answers to
the first requests of each path, and dropped connections. Re-exported from `prefetch.testing`.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping
from typing import Any


class _Faults:
    """What a `serve_folder` server injects, and the state that needs (shared by its threads)."""

    def __init__(
        self,
        latency_s: float,
        bandwidth_bytes_per_s: float | None,
        fail_first: int,
        drop_paths: Collection[str],
        slow_paths: Mapping[str, float],
        requests: list[str] | None = None,
    ) -> None:
        self.latency_s = latency_s
        self.requests = requests
        self.slow = {"/" + path.lstrip("/"): seconds for path, seconds in slow_paths.items()}
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.fail_first = fail_first
        self.dropped = {"/" + path.lstrip("/") for path in drop_paths}
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._link_free_at = 0.0  # when the shared link is next free (bandwidth cap)

    def verdict(self, path: str) -> tuple[str, int]:
        """After the latency: ("drop", 0), ("fail", n-th request of the path) or ("serve", n)."""
        latency_s = self.latency_s + self.slow.get(path, 0.0)
        if latency_s > 0:
            self.stopping.wait(latency_s)
        if path in self.dropped:
            return "drop", 0
        with self._lock:
            seen = self._counts[path] = self._counts.get(path, 0) + 1
        return ("fail" if seen <= self.fail_first else "serve"), seen

    def pace(self, size: int) -> None:
        """Wait until the shared link has carried `size` more bytes."""
        if not self.bandwidth_bytes_per_s:
            return
        with self._lock:
            start = max(time.monotonic(), self._link_free_at)
            self._link_free_at = start + size / self.bandwidth_bytes_per_s
            wake = self._link_free_at
        self.stopping.wait(max(0.0, wake - time.monotonic()))


class _LoopbackServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer whose request threads are joined on close (no leaked threads)."""

    daemon_threads = False
    block_on_close = True
    request_queue_size = 256  # dozens of workers connect at once; the default 5 drops SYNs

    def __init__(self, directory: str, faults: _Faults, request_timeout_s: float) -> None:
        self.directory = directory
        self.faults = faults
        self.request_timeout_s = request_timeout_s
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End the open connections (kept alive between requests), so their threads exit."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a killed worker, a timed-out read) is no server error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the server's folder after its faults had their say."""

    server: _LoopbackServer
    protocol_version = "HTTP/1.1"  # connections are kept alive, as object stores keep them

    def __init__(self, request: Any, address: Any, server: _LoopbackServer) -> None:
        super().__init__(request, address, server, directory=server.directory)

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout_s)  # an idle client is dropped
        # headers and body go out in two writes: without this, Nagle holds the body back until
        # the client's delayed ACK of the headers (40 ms a request on a kept-alive connection)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test and benchmark output quiet

    def _answered(self) -> bool:
        """Apply latency and faults; True when the request was answered (or dropped)."""
        faults = self.server.faults
        verdict, seen = faults.verdict(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path))
        if verdict == "drop":
            self.close_connection = True
        elif verdict == "fail":
            self.send_error(500, f"injected failure {seen} of {faults.fail_first}")
        return verdict != "serve"

    def do_GET(self) -> None:
        log = self.server.faults.requests
        if log is not None:
            log.append(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path))
        if not self._answered():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._answered():
            super().do_HEAD()

    def copyfile(self, source: Any, outputfile: Any) -> None:
        if not self.server.faults.bandwidth_bytes_per_s:
            shutil.copyfileobj(source, outputfile)
            return
        while chunk := source.read(16 * 1024):
            self.server.faults.pace(len(chunk))
            outputfile.write(chunk)


@contextlib.contextmanager
def serve_folder(
    root: str | os.PathLike[str],
    *,
    latency_s: float = 0.0,
    bandwidth_bytes_per_s: float | None = None,
    fail_first: int = 0,
    drop_paths: Collection[str] = (),
    slow_paths: Mapping[str, float] | None = None,
    request_timeout_s: float = 10.0,
    requests: list[str] | None = None,
) -> Iterator[str]:
    """Serve the files under `root` over HTTP on 127.0.0.1 and yield the base URL.

    A standard-library `ThreadingHTTPServer` on a free port runs in a thread for the duration
    of the `with` block; the base URL looks like ``http://127.0.0.1:PORT/``. It stands in for a
    remote store (a bucket, a web server) in tests and benchmarks, with no internet:

    - GET (and HEAD) of a file answers its bytes; of a directory, an HTML index of links like
      ``python -m http.server`` (which fsspec's HTTP filesystem lists); a missing path, 404.
    - `latency_s`: every request first sleeps this long (per request, concurrently: like a
      store's time to first byte, not a queue).
    - `bandwidth_bytes_per_s`: response bodies share this many bytes per second, all
      connections together (one link); None for no cap.
    - `fail_first`: the first `fail_first` requests of each path answer 500 (then it serves);
      requests are counted per path, GET and HEAD together.
    - `drop_paths`: paths relative to `root` (``"cat/a.jpg"``, a leading ``/`` optional) whose
      requests get the connection closed with no answer at all.
    - `slow_paths`: paths relative to `root` and the seconds each waits on top of `latency_s`
      (one stuck object among fast ones).
    - `request_timeout_s`: a connection that sends nothing for this long is closed.
    - `requests`: a list the server appends the path of every GET request to, as it arrives
      (``"/cat/a.jpg"``): how often each object was fetched.

    Connections are HTTP/1.1 and kept alive between requests (as object stores keep them), one
    thread each. On exit the server stops, latency sleeps are cut short, every connection is
    closed, and every thread it started is joined.
    """
    faults = _Faults(
        latency_s, bandwidth_bytes_per_s, fail_first, drop_paths, slow_paths or {}, requests
    )
    server = _LoopbackServer(os.fspath(root), faults, request_timeout_s)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="prefetch-serve-folder",
        daemon=True,
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        faults.stopping.set()
        server.shutdown()
        server.close_connections()
        server.server_close()  # joins the request threads (block_on_close)
        thread.join()
