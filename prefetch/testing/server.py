"""A loopback HTTP server over an image folder, with injected latency and faults.

`serve_folder` stands in for remote storage in tests and benchmarks (no internet): per-request
latency, a bandwidth cap shared by all connections, 500 answers to the first requests of each
path, and dropped connections. Re-exported from `prefetch.testing`.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator
from typing import Any


class _LoopbackServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer whose request threads are joined on close (no leaked threads)."""

    daemon_threads = False
    block_on_close = True
    request_queue_size = 256  # dozens of workers connect at once; the default 5 drops SYNs


@contextlib.contextmanager
def serve_folder(
    root: str | os.PathLike[str],
    *,
    latency_s: float = 0.0,
    bandwidth_bytes_per_s: float | None = None,
    fail_first: int = 0,
    drop_paths: Collection[str] = (),
    request_timeout_s: float = 10.0,
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
    - `request_timeout_s`: a connection that sends nothing for this long is closed.

    Connections are HTTP/1.0 (one request each). On exit the server stops, the requests in
    progress finish (latency sleeps are cut short), and every thread it started is joined.
    """
    directory = os.fspath(root)
    dropped = {"/" + path.lstrip("/") for path in drop_paths}
    stopping = threading.Event()
    lock = threading.Lock()
    counts: dict[str, int] = {}
    link_free_at = [0.0]  # when the shared link is next free (bandwidth cap)

    def pace(size: int) -> None:
        if not bandwidth_bytes_per_s:
            return
        with lock:
            start = max(time.monotonic(), link_free_at[0])
            link_free_at[0] = start + size / bandwidth_bytes_per_s
            wake = link_free_at[0]
        stopping.wait(max(0.0, wake - time.monotonic()))

    class Handler(http.server.SimpleHTTPRequestHandler):
        timeout = request_timeout_s

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test and benchmark output quiet

        def _inject(self) -> bool:
            """Apply latency and faults; True when the request was answered (or dropped)."""
            if latency_s > 0:
                stopping.wait(latency_s)
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            if path in dropped:
                self.close_connection = True
                return True
            with lock:
                counts[path] = counts.get(path, 0) + 1
                seen = counts[path]
            if seen <= fail_first:
                self.send_error(500, f"injected failure {seen} of {fail_first}")
                return True
            return False

        def do_GET(self) -> None:
            if not self._inject():
                super().do_GET()

        def do_HEAD(self) -> None:
            if not self._inject():
                super().do_HEAD()

        def copyfile(self, source: Any, outputfile: Any) -> None:
            if not bandwidth_bytes_per_s:
                shutil.copyfileobj(source, outputfile)
                return
            while chunk := source.read(16 * 1024):
                pace(len(chunk))
                outputfile.write(chunk)

    server = _LoopbackServer(("127.0.0.1", 0), Handler)
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
        stopping.set()
        server.shutdown()
        server.server_close()  # joins the request threads (block_on_close)
        thread.join()
