"""serve_folder: the loopback HTTP server that stands in for a remote store."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from prefetch.testing import serve_folder, write_image_folder


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        data: bytes = response.read()
        return data


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images", class_names=("cat", "dog"), per_class=2)


def test_serves_a_files_bytes(folder: Path) -> None:
    path = sorted((folder / "cat").iterdir())[0]
    with serve_folder(folder) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        assert _get(f"{url}cat/{path.name}") == path.read_bytes()
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(f"{url}cat/missing.jpg")
        assert missing.value.code == 404


def test_a_directory_answers_an_index_of_links(folder: Path) -> None:
    with serve_folder(folder) as url:
        root = _get(url).decode()
        listing = _get(f"{url}dog/").decode()
    assert 'href="cat/"' in root and 'href="dog/"' in root
    for path in (folder / "dog").iterdir():
        assert f'href="{path.name}"' in listing


def test_fails_the_first_requests_of_each_path_then_serves(folder: Path) -> None:
    first, second = sorted((folder / "cat").iterdir())
    with serve_folder(folder, fail_first=2) as url:
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as failed:
                _get(f"{url}cat/{first.name}")
            assert failed.value.code == 500
        assert _get(f"{url}cat/{first.name}") == first.read_bytes()
        with pytest.raises(urllib.error.HTTPError):  # counted per path
            _get(f"{url}cat/{second.name}")


def test_drops_the_connection_for_chosen_paths(folder: Path) -> None:
    dropped, kept = sorted((folder / "cat").iterdir())
    with serve_folder(folder, drop_paths=[f"cat/{dropped.name}"]) as url:
        with pytest.raises((ConnectionError, urllib.error.URLError)):  # RemoteDisconnected
            _get(f"{url}cat/{dropped.name}")
        assert _get(f"{url}cat/{kept.name}") == kept.read_bytes()


def test_every_request_waits_the_latency(folder: Path) -> None:
    path = sorted((folder / "cat").iterdir())[0]
    with serve_folder(folder, latency_s=0.1) as url:
        for _ in range(2):
            start = time.perf_counter()
            _get(f"{url}cat/{path.name}")
            assert time.perf_counter() - start >= 0.1


def test_a_slow_path_waits_longer_than_the_others(folder: Path) -> None:
    slow, fast = sorted((folder / "cat").iterdir())[:2]
    with serve_folder(folder, slow_paths={f"cat/{slow.name}": 0.3}) as url:
        start = time.perf_counter()
        assert _get(f"{url}cat/{slow.name}") == slow.read_bytes()
        assert time.perf_counter() - start >= 0.3
        assert _get(f"{url}cat/{fast.name}") == fast.read_bytes()


def test_bandwidth_cap_slows_the_body(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"x" * 100_000)
    with serve_folder(tmp_path, bandwidth_bytes_per_s=500_000) as url:
        start = time.perf_counter()
        assert len(_get(f"{url}blob.bin")) == 100_000
        assert time.perf_counter() - start >= 0.15  # 0.2 s at the cap


def test_exit_stops_the_server_and_joins_its_threads(folder: Path) -> None:
    before = set(threading.enumerate())
    path = sorted((folder / "cat").iterdir())[0]
    with serve_folder(folder, latency_s=0.05) as url:
        results: list[bytes] = []
        clients = [
            threading.Thread(target=lambda: results.append(_get(f"{url}cat/{path.name}")))
            for _ in range(8)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        assert len(results) == 8
    assert set(threading.enumerate()) <= before
    with pytest.raises(urllib.error.URLError):
        _get(url)
