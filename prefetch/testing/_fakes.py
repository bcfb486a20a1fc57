"""Fault-injecting decoders and transforms: they wrap the default decoder to sleep, fail,
kill their worker, hang, run their worker out of open files or wait for each other at chosen
files (a `marker` in the path). Plain picklable classes, so they work in thread and process
workers alike (those that kill, hang or limit their process: process workers only)."""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import threading
import time

import numpy as np

from prefetch.coordinator import Deadline
from prefetch.decode import DecodeOptions, decode_bytes, get_decoder
from prefetch.io import Location


class SlowDecoder:
    """The default decoder, after sleeping `delay_s` per image (a slow disk or heavy decode).

    With `marker`, it sleeps only for paths containing it. With `once_flag` (a file path), it
    sleeps only the first time, in whichever process: it creates the file before sleeping.
    Sleeping and decoding both release the GIL, so `backend="auto"` keeps threads for it.
    """

    releases_gil = True

    def __init__(
        self, delay_s: float, marker: str | None = None, once_flag: str | None = None
    ) -> None:
        self.delay_s = delay_s
        self.marker = marker
        self.once_flag = once_flag

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if (self.marker is None or self.marker in str(path)) and _first_time(self.once_flag):
            time.sleep(self.delay_s)
        return get_decoder("auto")(path, options)


class PlainReadDecoder:
    """A decoder of your own that reads the file with a plain `open(path).read()`, then decodes
    the bytes with `decode_bytes`. prefetch's decoders refuse a FIFO or a device at once; this
    one blocks on a FIFO without a writer, as a read from a dead network mount blocks: the
    stuck sample that `sample_timeout_s` bounds. Picklable; safe in many threads."""

    releases_gil = True

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        with open(path, "rb") as file:  # blocks on a FIFO until a writer comes
            data = file.read()
        return decode_bytes(data, options)


class FailingDecoder:
    """The default decoder, raising `error(message)` for any path containing `marker`."""

    releases_gil = True  # the default decoder's: `backend="auto"` keeps threads for it

    def __init__(self, marker: str, error: type[Exception] = ValueError) -> None:
        self.marker = marker
        self.error = error

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if self.marker in str(path):
            raise self.error(f"injected failure for {path}")
        return get_decoder("auto")(path, options)


class CrashingDecoder:
    """The default decoder, killing its worker process (`os._exit(exit_code)`) at any path with
    `marker`; with `signum` (say `signal.SIGSEGV`, a decoder's segfault) by that signal instead.

    With `once_flag` (a file path), it crashes only the first time: it creates the file before
    dying, so the restarted worker decodes the file normally. Use with backend="process".
    """

    def __init__(
        self,
        marker: str,
        once_flag: str | None = None,
        exit_code: int = 13,
        signum: int | None = None,
    ) -> None:
        self.marker = marker
        self.once_flag = once_flag
        self.exit_code = exit_code
        self.signum = signum

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if self.marker in str(path) and _first_time(self.once_flag):
            if self.signum is not None:
                os.kill(os.getpid(), self.signum)
            os._exit(self.exit_code)
        return get_decoder("auto")(path, options)


class HangingDecoder:
    """A decoder that never returns: a read from a dead network mount, a decoder in an endless
    loop. Each call first notes its arrival (a file named after its process and thread in the
    folder `arrivals`; `arrived()` counts them), then sleeps for good, so its worker never
    reads the `Stop` it is sent at close. With `ignore_sigterm`, its process ignores SIGTERM
    too (set before the arrival is noted), so only SIGKILL ends it. Use with backend="process"
    (a thread that hangs is never stopped), and one reader thread per worker process."""

    def __init__(self, arrivals: str | os.PathLike[str], ignore_sigterm: bool = False) -> None:
        self.arrivals = os.fspath(arrivals)
        self.ignore_sigterm = ignore_sigterm

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.path.join(self.arrivals, f"{os.getpid()}-{threading.get_ident()}"), "a"):
            pass
        while True:
            time.sleep(1.0)

    def arrived(self) -> int:
        """How many calls have begun (and hang) so far."""
        return len(os.listdir(self.arrivals))


class FileLimitDecoder:
    """The default decoder, in a worker process whose open-file limit (`RLIMIT_NOFILE`, soft
    and hard) it lowers as the worker starts (`prepare`) to leave room for one more file: the
    next file descriptor the worker is sent (a batch slot's) finds none, and the kernel drops
    it, as in a worker started under too low a `ulimit -n`. Use with backend="process" only: a
    thread worker would lower the limit of the loader's own process."""

    releases_gil = True

    def prepare(self) -> None:
        """Lower this process's open-file limit to one above its lowest free descriptor (a
        new descriptor takes the lowest free number, which must be under the limit)."""
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free + 1, lowest_free + 1))

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        return get_decoder("auto")(path, options)


class RendezvousDecoder:
    """The default decoder, whose first call in each process or thread first waits, up to
    `timeout_s`, until `parties` of them have arrived (arrivals are files in `folder`).

    It proves that `parties` workers read at the same time: when fewer ever get a sample, the
    wait ends with a `TimeoutError` that the loader raises. Works across worker processes.
    """

    releases_gil = True

    def __init__(self, folder: str | os.PathLike[str], parties: int, timeout_s: float = 30.0):
        self.folder = os.fspath(folder)
        self.parties = parties
        self.timeout_s = timeout_s

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        me = os.path.join(self.folder, f"{os.getpid()}-{threading.get_ident()}")
        if not os.path.exists(me):
            open(me, "x").close()
            deadline = Deadline(self.timeout_s)
            while len(os.listdir(self.folder)) < self.parties:
                if deadline.expired():
                    raise TimeoutError(
                        f"only {len(os.listdir(self.folder))} of {self.parties} workers "
                        f"were reading at once after {self.timeout_s:g} s"
                    )
                time.sleep(0.01)
        return get_decoder("auto")(path, options)


class RecordingDecoder:
    """The default decoder, after appending the sample's location to the file `log`, one line
    per sample as it starts: which samples the workers began, and in which order, in thread
    and process workers alike (each line is one append). `starts()` reads them back."""

    releases_gil = True

    def __init__(self, log: str | os.PathLike[str]) -> None:
        self.log = os.fspath(log)

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        with open(self.log, "a", encoding="utf-8") as log:
            log.write(f"{path}\n")
        return get_decoder("auto")(path, options)

    def starts(self) -> list[str]:
        """The locations started so far, in the order they started ([] before any)."""
        try:
            with open(self.log, encoding="utf-8") as log:
                return log.read().splitlines()
        except FileNotFoundError:
            return []


def _first_time(once_flag: str | None) -> bool:
    """True without a flag file; with one, True only for the call that creates it."""
    if once_flag is None:
        return True
    try:
        with open(once_flag, "x"):
            return True
    except FileExistsError:
        return False


class GilHoldingTransform:
    """A transform that holds the GIL (a pure-Python busy loop) for `delay_s` per image.

    It stands in for Python-heavy augmentation, the case `backend="auto"` sends to processes.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        deadline = time.perf_counter() + self.delay_s
        while time.perf_counter() < deadline:
            pass
        return image


def random_flip_and_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A sample augmentation that uses its random generator: flip half the images, add noise."""
    if rng.random() < 0.5:
        image = image[:, ::-1]
    noisy = image.astype(np.int16) + rng.integers(-8, 9, size=image.shape, dtype=np.int16)
    result: np.ndarray = np.clip(noisy, 0, 255).astype(np.uint8)
    return result


class SleepingSource:
    """A `Source` of `length` gray `shape` images whose `__getitem__` sleeps `delay_s` (a read
    that waits on storage), and counts how many reads run at once in every thread and worker
    process: `most_at_once()`. The count lives in the file `counter` (created empty if
    missing), updated under an exclusive `flock`, so the source pickles and works in thread
    and process workers alike."""

    def __init__(
        self,
        counter: str,
        length: int = 256,
        delay_s: float = 0.05,
        shape: tuple[int, ...] = (8, 8),
    ) -> None:
        self.counter = counter
        self.length = length
        self.delay_s = delay_s
        self.shape = shape
        with open(counter, "ab"):
            pass

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        self._count(+1)
        try:
            time.sleep(self.delay_s)
        finally:
            self._count(-1)
        return np.full(self.shape, index % 251, np.uint8), index % 2

    def most_at_once(self) -> int:
        """The most reads that ran at the same time so far."""
        return self._read()[1]

    def _read(self) -> tuple[int, int]:
        with open(self.counter, "rb") as file:
            now, most = [*file.read().split(), b"0", b"0"][:2]
        return int(now), int(most)

    def _count(self, step: int) -> None:
        with open(self.counter, "r+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            now, most = [*file.read().split(), b"0", b"0"][:2]
            now_count = int(now) + step
            file.seek(0)
            file.truncate()
            file.write(f"{now_count} {max(int(most), now_count)}".encode())
