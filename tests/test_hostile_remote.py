"""Remote folders and the object cache against hostile servers and a hostile neighbour (issue 21).

Nothing a server sends may hang a listing or a read, exhaust memory, lead out of the listed
root or poison `cache_dir`; nothing a neighbour does to the cache folder after it was checked
may feed their files into training. The servers are `prefetch.testing.serve_hostile` (raw
sockets on 127.0.0.1, every loop bounded) and `serve_folder`; each test names the point of
the issue it covers. Deadlines and caps are set small where the defaults would only make the
test slow; the defaults themselves are checked where they are cheap to reach.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
import prefetch.io._cache
from prefetch import Augment, ImageFolder, Loader, RemoteOptions
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.decode._turbo import decode_turbo
from prefetch.io import _storage as storage
from prefetch.io import _tree as remote_tree
from prefetch.io._cache import ObjectCache
from prefetch.testing import Reply, index_page, redirect, serve_folder, serve_hostile

pytestmark = pytest.mark.usefixtures("fsspec_io_thread")

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")

SIZE = (16, 16)
MiB = 1 << 20


def jpeg(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """A real JPEG whose pixels differ with `seed`."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize(SIZE[::-1]))


def as_a_web_server_does(
    routes: dict[str, Reply] | Callable[[str], Reply | None],
) -> Callable[[str], Reply | None]:
    """`routes`, with a folder asked for without its "/" redirected to it (301), as
    `python -m http.server` and nginx do."""

    def answer(path: str) -> Reply | None:
        found = routes.get(path) if isinstance(routes, dict) else routes(path)
        if found is None and not path.endswith("/"):
            folder = routes.get(path + "/") if isinstance(routes, dict) else routes(path + "/")
            if folder is not None:
                return redirect(path + "/", status=301)
        return found

    return answer


def epoch_images(loader: Loader) -> np.ndarray:
    with loader:
        batches = [batch.images.copy() for batch in loader]
    return np.concatenate(batches) if batches else np.zeros((0, *SIZE, 3), np.uint8)


# --- 1. deadlines: a stalled listing ends, names the URL and the option; Ctrl-C ends it -------


def test_a_listing_that_stalls_mid_page_ends_at_the_read_deadline_naming_url_and_option() -> None:
    page = index_page(["cat/", "dog/"])
    stalled = Reply(body=page.body, stall_after=len(page.body) // 2)
    with serve_hostile({"/train/": stalled, "/train": stalled}) as server:
        url = server.url + "train/"
        began = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            ImageFolder(url, remote=RemoteOptions(read_timeout_s=0.3))
        elapsed = time.monotonic() - began
    message = str(raised.value)
    assert url in message and "read_timeout_s=0.3" in message and "after 4 attempts" in message
    assert elapsed < 10  # 4 attempts of 0.3 s and the backoff, not aiohttp's 300 s each
    assert server.requests.count("/train/") == 4


def test_a_request_slower_than_its_whole_deadline_names_that_option() -> None:
    # a byte every 0.1 s dodges the read deadline; the whole request's ends it
    def trickle(path: str) -> Reply | None:
        return Reply(body=b"x", endless=True, interval_s=0.1) if path == "/slow.jpg" else None

    with serve_hostile(trickle) as server:
        options = RemoteOptions(read_timeout_s=5, request_timeout_s=0.5)
        with pytest.raises(TimeoutError, match=r"request_timeout_s=0\.5"):
            storage.read_bytes(server.url + "slow.jpg", retries=0, options=options)


def test_the_default_deadlines_and_caps_suit_object_stores_and_bound_everything() -> None:
    options = RemoteOptions()
    assert (options.connect_timeout_s, options.read_timeout_s) == (10.0, 30.0)
    assert options.request_timeout_s == 60.0
    assert options.max_object_bytes == 1 << 30
    assert options.max_listing_pages == 100_000 and options.max_depth == 32
    assert options.max_page_bytes == 32 * MiB
    assert options.follow_redirects == "same-host"
    assert storage.active_options() == options


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("read_timeout_s", 0, r"read_timeout_s must be a number of seconds > 0, got 0"),
        ("request_timeout_s", float("inf"), r"request_timeout_s must be .* got inf"),
        ("connect_timeout_s", "10", r"connect_timeout_s must be .* got '10'"),
        ("max_object_bytes", 0, r"max_object_bytes must be an int >= 1, got 0: pass e\.g\."),
        ("max_depth", True, r"max_depth must be an int >= 1, got True"),
        ("follow_redirects", "sometimes", r"follow_redirects must be one of .*'sometimes'"),
    ],
)
def test_bad_remote_options_are_refused_naming_the_value_and_the_fix(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RemoteOptions(**{field: value})  # type: ignore[arg-type]


CTRL_C_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from prefetch import ImageFolder
    # As in a terminal. A runner started in the background (`make test &`, some CI shells)
    # ignores SIGINT, children inherit that, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ImageFolder(sys.argv[1])  # the default deadlines: 30 s without a byte, 4 attempts
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("listed", flush=True)
    """
)


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_a_stalled_listing_at_once() -> None:
    page = index_page(["cat/"])
    stalled = Reply(body=page.body, stall_after=20)
    with serve_hostile({"/train/": stalled, "/train": stalled}) as server:
        child = subprocess.Popen(
            [sys.executable, "-c", CTRL_C_CHILD, server.url + "train/"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not server.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.requests, "the child never asked for the page"
            time.sleep(0.3)  # well inside the stalled answer
            child.send_signal(signal.SIGINT)
            sent = time.monotonic()
            out, err = child.communicate(timeout=10)
            took = time.monotonic() - sent
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert "interrupted" in out, err
    assert child.returncode == 130
    assert took < 5.0, f"Ctrl-C took {took:.1f} s to end the listing"  # not a stalled read's 30 s


# --- 2. links are resolved before the root check; only links inside the root are followed ---


def test_links_that_lead_out_of_the_root_are_not_followed(tmp_path: Path) -> None:
    inside, outside = jpeg(1), jpeg(2)

    def routes(path: str) -> Reply | None:
        pages = {
            "/data/train/": index_page(
                [
                    "cat/",
                    "../secret/",
                    "%2e%2e/secret/",
                    "%2E%2e/",
                    ".%2e/secret/",
                    "/data/secret/",
                    "cat/../../secret/",
                    "..%2fsecret/",
                    "..\\secret/",
                    f"{server.url}data/secret/",
                    "?C=N;O=D",
                ]
            ),
            "/data/train/cat/": index_page(
                ["a.jpg", "../../secret/b.jpg", "%2e%2e/%2e%2e/secret/c.jpg", "/data/secret/d.jpg"]
            ),
            "/data/train/cat/a.jpg": Reply(body=inside, headers={"Content-Type": "image/jpeg"}),
        }
        if path in pages:
            return pages[path]
        if not path.startswith("/data/train/") or "secret" in path:
            # what an escape would reach is served, so that following it would work
            if path.endswith("/"):
                return index_page(["b.jpg", "c.jpg", "d.jpg"])
            return Reply(body=outside, headers={"Content-Type": "image/jpeg"})
        return None

    with serve_hostile(as_a_web_server_does(routes)) as server:
        url = server.url + "data/train/"
        folder = ImageFolder(url)
        assert folder.class_names == ["cat"]
        assert folder.paths.tolist() == [url + "cat/a.jpg"]
        loader = Loader(folder, image_size=SIZE, backend="thread", decoder="pillow")
        images = epoch_images(loader)
        assert len(images) == 1
        np.testing.assert_array_equal(images[0], decode_image_bytes(inside, tmp_path))
        escapes = [path for path in server.requests if not path.startswith("/data/train/")]
        assert not escapes and not [path for path in server.requests if "secret" in path]


def decode_image_bytes(data: bytes, folder: Path) -> np.ndarray:
    path = folder / "expected.jpg"
    path.write_bytes(data)
    return decode_image(str(path), DecodeOptions(image_size=SIZE))


# --- 3. empty segments and other schemes: no loop, no growth ---------------------------------


def test_empty_segments_and_file_links_do_not_loop(tmp_path: Path) -> None:
    def routes(path: str) -> Reply | None:
        if path == "/train/":
            return index_page(["cat/", "cat//", "//", "///etc/", "file:///etc/", "file:///train/"])
        if path.startswith("/train/cat/") and path.endswith("/"):
            # every folder below cat links an empty segment back to itself: a loop if followed
            return index_page(["a.jpg", "./", ".//", "sub//", "//train/cat/"])
        if path == "/train/cat/a.jpg":
            return Reply(body=jpeg(3), headers={"Content-Type": "image/jpeg"})
        if path.endswith("/"):
            return index_page([])  # any other folder: empty, but there
        return None

    with serve_hostile(as_a_web_server_does(routes), max_seconds=60) as server:
        folder = ImageFolder(server.url + "train/")
        assert folder.class_names == ["cat"]
        assert folder.paths.tolist() == [server.url + "train/cat/a.jpg"]
        assert server.requests == ["/train/", "/train/cat/"]


def test_the_resolver_refuses_what_would_leave_the_folder_or_loop() -> None:
    from prefetch.io._links import resolve

    base = "http://127.0.0.1:8000/train/"
    assert resolve(base, "cat/") == base + "cat/"
    assert resolve(base, "a%20b.jpg") == base + "a%20b.jpg"
    assert resolve(base, "c%61t/") == base + "cat/"  # an escaped unreserved character
    assert resolve(base, "/train/cat/x.jpg") == base + "cat/x.jpg"
    assert resolve(base, "HTTP://127.0.0.1:8000/train/x.jpg") == base + "x.jpg"
    for link in (
        "../x.jpg",
        "%2e%2e/x.jpg",
        ".%2E/",
        "cat/../../x.jpg",
        "./",
        "",
        "cat//",
        "cat//x.jpg",
        "//",
        "//other/train/x.jpg",
        "file:///etc/passwd",
        "ftp://127.0.0.1:8000/train/x.jpg",
        "https://127.0.0.1:8000/train/x.jpg",  # another scheme: another origin
        "http://127.0.0.1:8001/train/x.jpg",
        "..%2fx.jpg",
        "cat\\..\\..\\x.jpg",
        "?C=N;O=D",
    ):
        assert resolve(base, link) is None, link


# --- 4. a failing sub-folder page names that page; on_error="skip" leaves it out -------------


def test_a_missing_sub_folder_page_is_an_error_naming_it_or_skipped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = {
        "/train/": index_page(["cat/", "dog/"]),
        "/train/cat/": index_page(["a.jpg"]),
        "/train/cat/a.jpg": Reply(body=jpeg(4), headers={"Content-Type": "image/jpeg"}),
    }
    with serve_hostile(as_a_web_server_does(routes)) as server:
        url = server.url + "train/"
        with pytest.raises(OSError) as raised:
            ImageFolder(url)
        assert not isinstance(raised.value, FileNotFoundError)  # the root exists
        message = str(raised.value)
        assert f"{url}dog/" in message and f"linked from '{url}'" in message
        assert "does not exist" not in message and "on_error='skip'" in message
        with caplog.at_level(logging.WARNING, logger="prefetch.loader"):
            folder = ImageFolder(url, on_error="skip")
            loader = Loader(url, image_size=SIZE, on_error="skip", backend="thread")
        assert folder.class_names == loader.class_names == ["cat"]
        assert f"{url}dog/" in caplog.text and "left out" in caplog.text
        with pytest.raises(FileNotFoundError, match="does not exist"):
            ImageFolder(server.url + "nothing/")  # a missing root is still that


# --- 5. caps on listings: pages, depth, page bytes; progress on the prefetch.runtime._loader
# logger ---


def endless_tree(path: str) -> Reply | None:
    """Every folder below /train/ has two more folders and an image: no end in any direction."""
    if path.startswith("/train/") and path.endswith("/"):
        return index_page(["left/", "right/", "a.jpg"])
    return None


def test_an_endless_tree_stops_at_the_page_cap_naming_it() -> None:
    with serve_hostile(endless_tree) as server:
        with pytest.raises(OSError, match=r"more than max_listing_pages=50 folder pages"):
            ImageFolder(server.url + "train/", remote=RemoteOptions(max_listing_pages=50))
        assert len(server.requests) <= 50


def test_an_endless_chain_of_folders_stops_at_the_default_depth_cap() -> None:
    def chain(path: str) -> Reply | None:
        return index_page(["deeper/", "a.jpg"]) if path.endswith("/") else None

    with serve_hostile(chain) as server, pytest.raises(OSError, match=r"max_depth=32"):
        ImageFolder(server.url + "train/")
    assert len(server.requests) == 33  # the root and 32 folders below it


def test_a_huge_or_endless_index_page_stops_at_the_page_bytes_cap() -> None:
    routes = {
        "/huge/": index_page(["cat/"], padding=2 * MiB),
        "/endless/": Reply(body=b'<a href="cat/">cat</a>\n' * 1000, endless=True),
    }
    with serve_hostile(routes) as server:
        with pytest.raises(OSError, match=r"max_page_bytes=1048576"):
            ImageFolder(server.url + "huge/", remote=RemoteOptions(max_page_bytes=MiB))
        with pytest.raises(OSError, match=r"max_page_bytes=33554432"):  # the default cap
            ImageFolder(server.url + "endless/")


def test_a_long_listing_logs_its_progress(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(remote_tree, "PROGRESS_EVERY_S", 0.0)

    def tree(path: str) -> Reply | None:
        if path == "/train/":
            return index_page([f"c{index}/" for index in range(5)])
        if path.endswith("/"):
            return index_page(["a.jpg"])
        return None

    with (
        serve_hostile(tree) as server,
        caplog.at_level(logging.INFO, logger="prefetch.loader"),
    ):
        ImageFolder(server.url + "train/")
    assert "folder pages read" in caplog.text and server.url in caplog.text


# --- 6. a size cap on every read: remote bodies and local files --------------------------------


def test_an_endless_or_oversized_body_stops_at_the_object_cap_naming_it() -> None:
    routes = {
        "/endless.jpg": Reply(endless=True, content_length=False),
        "/big.jpg": Reply(body=bytes(2 * MiB)),
    }
    options = RemoteOptions(max_object_bytes=MiB)
    with serve_hostile(routes) as server:
        for name in ("endless.jpg", "big.jpg"):
            url = server.url + name
            with pytest.raises(OSError, match=f"{url}.* max_object_bytes=1048576"):
                storage.read_bytes(url, options=options)
            assert server.requests.count("/" + name) == 1  # a cap is not retried
        with storage.using(options), pytest.raises(OSError, match="max_object_bytes=1048576"):
            storage.read_bytes(server.url + "endless.jpg")  # the thread's options


def test_a_loader_reads_remote_objects_within_its_remote_options(tmp_path: Path) -> None:
    routes = {
        "/train/": index_page(["cat/"]),
        "/train/cat/": index_page(["a.jpg", "b.jpg"]),
        "/train/cat/a.jpg": Reply(body=jpeg(5)),
        "/train/cat/b.jpg": Reply(endless=True, content_length=False),
    }
    with serve_hostile(routes) as server:
        url = server.url + "train/"
        for backend in ("thread", "process"):
            loader = Loader(
                url,
                image_size=SIZE,
                backend=backend,
                workers=1,
                on_error="skip",
                remote=RemoteOptions(max_object_bytes=MiB),
            )
            assert len(epoch_images(loader)) == 1, backend
            (error,) = loader.stats().skipped_paths
            assert error == url + "cat/b.jpg"
        assert Loader(url, image_size=SIZE).options.remote == RemoteOptions()


@pytest.mark.parametrize("decoder", ["pillow", "turbo", "crop"])
def test_a_local_jpg_that_is_dev_zero_or_a_fifo_is_refused_at_once(
    tmp_path: Path, decoder: str
) -> None:
    if decoder == "turbo":
        pytest.importorskip("simplejpeg")
    root = tmp_path / "train"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(jpeg(6))
    (root / "cat" / "zero.jpg").symlink_to("/dev/zero")
    refused = ["zero.jpg"]
    if decoder != "pillow":  # Pillow's own open() of a FIFO waits for a writer (decode.py)
        os.mkfifo(root / "cat" / "fifo.jpg")
        refused.insert(0, "fifo.jpg")
    options = dict(image_size=SIZE, backend="thread", workers=1, on_error="skip")
    if decoder == "crop":
        loader = Loader(root, augment=Augment(crop=prefetch.CenterCrop(0.875)), **options)  # type: ignore[arg-type]
    else:
        loader = Loader(root, decoder=decoder, **options)  # type: ignore[arg-type]
    began = time.monotonic()
    images = epoch_images(loader)
    assert time.monotonic() - began < 20
    assert len(images) == 1
    assert sorted(Path(path).name for path in loader.stats().skipped_paths) == refused


def test_a_local_file_larger_than_the_cap_is_an_error_naming_it_and_the_cap(
    tmp_path: Path,
) -> None:
    path = tmp_path / "big.jpg"
    path.write_bytes(jpeg(7) + bytes(4096))
    with pytest.raises(OSError, match=f"'{path}' is .* larger than max_object_bytes=1000"):
        storage.read_local(str(path), 1000)
    with (
        storage.using(RemoteOptions(max_object_bytes=1000)),
        pytest.raises(OSError, match="max_object_bytes=1000"),
    ):
        decode_turbo(str(path), DecodeOptions(image_size=SIZE))
    assert storage.read_local(str(path)) == path.read_bytes()


# --- 7. redirects stay on the same host by default; nothing from elsewhere is cached --------


def test_a_redirect_to_another_host_is_refused_and_nothing_of_it_is_cached(
    tmp_path: Path,
) -> None:
    token = b'{"access_token": "metadata-secret"}'
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    (metadata / "token").write_bytes(token)
    good = jpeg(8)
    with serve_folder(metadata) as elsewhere:
        routes = {
            "/train/": index_page(["cat/"]),
            "/train/cat/": index_page(["a.jpg", "b.jpg", "c.jpg"]),
            "/train/cat/a.jpg": redirect(elsewhere + "token"),
            "/train/cat/b.jpg": Reply(body=good),
            "/train/cat/c.jpg": redirect("/train/cat/b.jpg", status=301),  # same host: followed
        }
        with serve_hostile(routes) as server:
            url = server.url + "train/"
            with pytest.raises(PermissionError) as raised:
                storage.read_bytes(url + "cat/a.jpg")
            message = str(raised.value)
            assert url + "cat/a.jpg" in message and elsewhere + "token" in message
            assert "follow_redirects='same-host'" in message
            assert storage.read_bytes(url + "cat/c.jpg") == good
            cache_dir = tmp_path / "cache"
            loader = Loader(
                url,
                image_size=SIZE,
                remote=RemoteOptions(cache_dir=cache_dir),
                on_error="skip",
                backend="thread",
            )
            assert len(epoch_images(loader)) == 2
            assert loader.stats().skipped_paths == (url + "cat/a.jpg",)
            copies = [item for item in cache_dir.iterdir() if not item.name.startswith(".")]
            assert all(token not in copy.read_bytes() for copy in copies)
            assert len(copies) == 2
            anywhere = RemoteOptions(follow_redirects="any")
            assert storage.read_bytes(url + "cat/a.jpg", options=anywhere) == token
            with pytest.raises(PermissionError, match="follow_redirects='none'"):
                storage.read_bytes(
                    url + "cat/c.jpg", options=RemoteOptions(follow_redirects="none")
                )


def test_a_redirect_to_another_scheme_is_never_followed() -> None:
    routes = {"/a.jpg": redirect("file:///etc/passwd")}
    with serve_hostile(routes) as server, pytest.raises(PermissionError, match="file:///etc"):
        storage.read_bytes(server.url + "a.jpg", options=RemoteOptions(follow_redirects="any"))


# --- 8. the cache keeps only what was read whole and decoded -----------------------------------


class FlakyObject:
    """Answers `bad` the first `times` requests of a path, then the real object."""

    def __init__(self, routes: dict[str, Reply], path: str, bad: Reply, times: int = 1) -> None:
        self.routes, self.path, self.bad, self.left = routes, path, bad, times
        self.lock = threading.Lock()

    def __call__(self, path: str) -> Reply | None:
        with self.lock:
            if path == self.path and self.left > 0:
                self.left -= 1
                return self.bad
        return self.routes.get(path)


def cached_tree() -> tuple[dict[str, Reply], list[bytes]]:
    images = [jpeg(10 + index, size=(96, 80)) for index in range(3)]
    routes = {
        "/train/": index_page(["cat/"]),
        "/train/cat/": index_page([f"{index}.jpg" for index in range(3)]),
        **{f"/train/cat/{index}.jpg": Reply(body=data) for index, data in enumerate(images)},
    }
    return routes, images


@pytest.mark.parametrize("bad", ["short body without Content-Length", "200 HTML page"])
def test_a_bad_first_answer_is_not_kept_and_the_next_epoch_reads_and_keeps_the_object(
    tmp_path: Path, bad: str
) -> None:
    routes, images = cached_tree()
    if bad == "200 HTML page":
        reply = Reply(body=b"<html><body>502 Bad Gateway, try later</body></html>")
    else:
        reply = Reply(body=images[1][: len(images[1]) // 2], content_length=False)
    flaky = FlakyObject(routes, "/train/cat/1.jpg", reply)
    cache_dir = tmp_path / "cache"
    with serve_hostile(flaky) as server:
        url = server.url + "train/"
        loader = Loader(
            url,
            image_size=SIZE,
            remote=RemoteOptions(cache_dir=cache_dir),
            on_error="skip",
            backend="thread",
            shuffle=False,
            decoder="pillow",
        )
        # Each epoch on its own (no `with loader:`): an open loader would read the next
        # epoch's batch ahead, during this one, and keep the object a whole epoch early.
        first = np.concatenate([batch.images.copy() for batch in loader])
        assert loader.stats().skipped_paths == (url + "cat/1.jpg",)
        assert len(first) == 2
        assert len([item for item in cache_dir.iterdir() if not item.name.startswith(".")]) == 2
        loader.reset_stats()
        second = np.concatenate([batch.images.copy() for batch in loader])
        assert loader.stats().skipped == 0 and len(second) == 3
        assert (loader.stats().cache_hits, loader.stats().cache_misses) == (2, 1)
    # the server is gone: every sample comes from a kept copy, and equals the real object
    loader.reset_stats()
    third = epoch_images(loader)
    assert (loader.stats().cache_hits, loader.stats().cache_misses) == (3, 0)
    np.testing.assert_array_equal(third, second)
    np.testing.assert_array_equal(third[1], decode_image_bytes(images[1], tmp_path))


def test_a_whole_body_without_content_length_is_decoded_but_not_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch.io._cache, "_warned", set())  # each warning is once per process
    data = jpeg(20)
    routes = {"/a.jpg": Reply(body=data, content_length=False)}
    cache = ObjectCache.open(tmp_path / "cache")
    with serve_hostile(routes) as server, caplog.at_level(logging.WARNING, "prefetch.cache"):
        url = server.url + "a.jpg"
        for _ in range(2):
            image, kept = cache.decoded(url, decode_path)
            assert not kept
            np.testing.assert_array_equal(image, decode_image_bytes(data, tmp_path))
        assert server.requests == ["/a.jpg", "/a.jpg"]
    assert sorted(os.listdir(cache.folder)) == [".ledger", ".users"]
    assert caplog.text.count("without a Content-Length") == 1


def decode_path(path: str) -> np.ndarray:
    return decode_image(path, DecodeOptions(image_size=SIZE))


def test_a_kept_copy_that_does_not_decode_is_removed_and_read_again_once(tmp_path: Path) -> None:
    routes, images = cached_tree()
    cache = ObjectCache.open(tmp_path / "cache")
    with serve_hostile(routes) as server:
        url = server.url + "train/cat/0.jpg"
        Path(cache.path_for(url)).write_bytes(b"<html>an error page kept by an old run</html>")
        image, kept = cache.decoded(url, decode_path)
        assert not kept and server.requests == ["/train/cat/0.jpg"]
        np.testing.assert_array_equal(image, decode_image_bytes(images[0], tmp_path))
        assert Path(cache.path_for(url)).read_bytes() == images[0]
        image, kept = cache.decoded(url, decode_path)  # now from the copy
        assert kept and server.requests == ["/train/cat/0.jpg"]
        # an object that never decodes: read once more, then its error; nothing kept
        broken = server.url + "train/"  # an index page, not an image
        Path(cache.path_for(broken)).write_bytes(b"junk")
        with pytest.raises(OSError, match="cannot identify image"):
            cache.decoded(broken, decode_path)
        assert server.requests.count("/train/") == 1
        assert not Path(cache.path_for(broken)).exists()


def test_a_copy_is_fsynced_before_it_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    routes, _ = cached_tree()
    cache = ObjectCache.open(tmp_path / "cache")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(handle: int) -> None:
        calls.append("fsync " + ("dir" if stat.S_ISDIR(os.fstat(handle).st_mode) else "file"))
        real_fsync(handle)

    def replace(*args: object, **kwargs: object) -> None:
        calls.append("rename")
        real_replace(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with serve_hostile(routes) as server:
        cache.decoded(server.url + "train/cat/2.jpg", decode_path)
    assert calls == ["fsync file", "rename", "fsync dir"]


# --- 9. the cache folder is held by a descriptor, checked through it, parents included ------


def test_a_cache_folder_swapped_after_it_was_checked_is_never_read(tmp_path: Path) -> None:
    routes, images = cached_tree()
    folder = tmp_path / "cache"
    cache = ObjectCache.open(folder)
    with serve_hostile(routes) as server:
        url = server.url + "train/cat/0.jpg"
        # a neighbour swaps in a folder of theirs, with their picture under the copy's name
        folder.rename(tmp_path / "moved")
        folder.mkdir(mode=0o700)
        planted = jpeg(99)
        (folder / cache.name_for(url)).write_bytes(planted)
        image, kept = cache.decoded(url, decode_path)
    assert not kept  # not the planted copy: read from the store, into the folder checked
    np.testing.assert_array_equal(image, decode_image_bytes(images[0], tmp_path))
    assert (tmp_path / "moved" / cache.name_for(url)).read_bytes() == images[0]
    assert (folder / cache.name_for(url)).read_bytes() == planted
    # a worker process opens the folder again: the one at the path now is refused
    with pytest.raises(ValueError, match="was replaced by another folder"):
        pickle.loads(pickle.dumps(cache)).decoded(url, decode_path)


def test_a_cache_folder_inside_a_folder_others_may_write_to_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename what is inside
    with pytest.raises(ValueError, match=f"inside '{shared}', which others may write to"):
        ObjectCache.open(shared / "cache")
    shared.chmod(0o1777)  # like /tmp: others may not rename what is ours
    assert ObjectCache.open(shared / "cache").folder == str(shared / "cache")
    link = tmp_path / "link"
    link.symlink_to(shared / "cache")
    with pytest.raises(ValueError, match="is a symbolic link"):
        ObjectCache.open(link)
    if os.geteuid() == 0:  # root can give a folder to another user, as a neighbour's would be
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ValueError, match="which belongs to user 65534"):
            ObjectCache.open(theirs / "cache")


def test_the_loader_passes_its_remote_options_to_the_listing(tmp_path: Path) -> None:
    with serve_hostile(endless_tree) as server, pytest.raises(OSError, match="pages=20"):
        Loader(server.url + "train/", remote=RemoteOptions(max_listing_pages=20))


@pytest.mark.tf
def test_the_keras_drop_in_takes_the_same_bounds() -> None:
    """`prefetch.tf.image_dataset_from_directory(url, remote=...)` lists within them."""
    import prefetch.tf

    with serve_hostile(endless_tree) as server:
        with pytest.raises(OSError, match=r"more than max_listing_pages=20 folder pages"):
            prefetch.tf.image_dataset_from_directory(
                server.url + "train/", remote=RemoteOptions(max_listing_pages=20), verbose=False
            )
        assert len(server.requests) <= 20


def test_a_failing_page_beside_a_slow_one_is_the_error_raised() -> None:
    """The failure of one folder page is raised while its siblings are still being read (not
    asyncio's "Result is not set" for the first sibling in the list)."""

    def routes(path: str) -> Reply | None:
        if path == "/train/":
            return index_page(["cat/", "dog/"])
        if path == "/train/cat/":
            time.sleep(1.0)  # still in flight when dog/ fails
            return index_page(["a.jpg"])
        return None  # dog/ answers 404 at once

    with serve_hostile(as_a_web_server_does(routes)) as server:
        url = server.url + "train/"
        with pytest.raises(OSError, match="dog/") as raised:
            ImageFolder(url)
        assert not isinstance(raised.value, FileNotFoundError)
