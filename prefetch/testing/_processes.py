"""Python processes for the tests: several run at once as the ranks of one job (tf.distribute
workers, torch.distributed ranks, on loopback), or one program run with this prefetch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from prefetch.coordinator import Deadline


def run_python(code: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -c code` in a new interpreter that imports this prefetch (its folder first on
    `PYTHONPATH`), its output captured as text; `subprocess.TimeoutExpired` past `timeout_s`.
    For what must run in a fresh process: a module missing, a deadline from import on."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment = {**os.environ, "PYTHONPATH": checkout}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout_s,
        check=False,
    )


def run_together(
    commands: list[list[str]], envs: list[dict[str, str]], logs: list[Path], timeout_s: float
) -> list[int | None]:
    """Run the commands at once, each writing its output to its log; stop when all end, one
    fails, or `timeout_s` passes.

    Returns their exit codes (None: still running at the deadline). Any process still running
    then is killed and every one is waited for, so nothing outlives the call.
    """
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command, env, log in zip(commands, envs, logs, strict=True):
            with open(log, "wb") as output:
                processes.append(
                    subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
                )
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            codes = [p.poll() for p in processes]
            if all(code is not None for code in codes) or any(codes):
                break
            time.sleep(0.2)
        return [p.poll() for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for process in processes:
            process.wait()


def log_tails(logs: list[Path], lines: int = 30) -> str:
    """The last `lines` lines of each log that exists, under its name (for a failure message)."""
    return "\n".join(
        f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in logs
        if log.exists()
    )


def free_ports(count: int) -> list[int]:
    """`count` TCP ports of loopback that were free a moment ago (for a job's coordinator)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
