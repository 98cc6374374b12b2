"""Where a run executes: this machine, or a GPU host over SSH.

A Host runs argv lists (never shell strings built from user input), streams their output line
by line, stops them on a timeout or a cancel request (the whole process group), and moves files
to and from itself. Engines are written against this interface only, so the same engine runs
locally or remotely; results come back as bundle directories.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import CommandCancelled, CommandFailed, CommandTimeout, HostError

LineSink = Callable[[str], None]
StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    returncode: int
    output: str  # stdout and stderr, interleaved as they came
    seconds: float


def describe_argv(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


class Host(ABC):
    """A machine that runs commands and holds files."""

    name: str

    @abstractmethod
    def run(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
            timeout_s: float | None = None, on_line: LineSink | None = None,
            should_stop: StopCheck | None = None, check: bool = True) -> CommandResult:
        """Run argv; raise CommandFailed (check=True), CommandTimeout or CommandCancelled."""

    @abstractmethod
    def mkdtemp(self, prefix: str = "stepwatch-") -> str: ...

    @abstractmethod
    def put(self, local: Path, remote_dir: str) -> str:
        """Copy a local file or directory into remote_dir; return its path there."""

    @abstractmethod
    def get(self, remote_path: str, local_dir: Path) -> Path:
        """Copy a file or directory from the host into local_dir; return its local path."""

    @abstractmethod
    def rmtree(self, remote_path: str) -> None: ...

    @abstractmethod
    def check(self) -> None:
        """Raise HostError if the host cannot be used."""


def run_process(popen_argv: list[str], *, shown_argv: list[str], cwd: str | None, env: dict | None,
                timeout_s: float | None, on_line: LineSink | None, should_stop: StopCheck | None,
                check: bool) -> CommandResult:
    """Run a process in its own process group, pumping its output; used by every Host."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(popen_argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True, errors="replace", bufsize=1)
    except FileNotFoundError as e:  # the program, or the working directory (Popen names which in e.filename)
        if cwd is not None and e.filename == cwd:
            raise CommandFailed(f"{cwd}: no such working directory (for {describe_argv(shown_argv)})") from None
        raise CommandFailed(f"{popen_argv[0]}: no such program") from None
    except NotADirectoryError:
        raise CommandFailed(f"{cwd}: not a directory (the working directory of {describe_argv(shown_argv)})") from None
    except OSError as e:
        raise CommandFailed(f"{popen_argv[0]}: cannot start ({e.strerror})") from None
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    outcome = None
    while proc.poll() is None:
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            outcome = "timeout"
        elif should_stop is not None and should_stop():
            outcome = "cancelled"
        if outcome:
            _kill_group(proc)
            break
        time.sleep(0.1)
    proc.wait()
    reader.join(timeout=5)
    result = CommandResult(shown_argv, proc.returncode, "".join(lines), time.monotonic() - started)
    what = describe_argv(shown_argv)
    if outcome == "timeout":
        raise CommandTimeout(f"timed out after {timeout_s:.0f} s: {what}", result)
    if outcome == "cancelled":
        raise CommandCancelled(f"cancelled: {what}", result)
    if check and proc.returncode != 0:
        tail = result.output.strip().splitlines()[-1:] or ["(no output)"]
        raise CommandFailed(f"{tail[0]} (exit code {proc.returncode} of {what})", result)  # the cause first
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class LocalHost(Host):
    """This machine."""

    name = "local"

    def run(self, argv, *, cwd=None, env=None, timeout_s=None, on_line=None, should_stop=None, check=True):
        full_env = {**os.environ, **(env or {})}
        return run_process(list(argv), shown_argv=list(argv), cwd=cwd, env=full_env, timeout_s=timeout_s,
                           on_line=on_line, should_stop=should_stop, check=check)

    def mkdtemp(self, prefix="stepwatch-"):
        return tempfile.mkdtemp(prefix=prefix)

    def put(self, local, remote_dir):
        target = Path(remote_dir) / Path(local).name
        if Path(local).is_dir():
            shutil.copytree(local, target, dirs_exist_ok=True)
        else:
            shutil.copy2(local, target)
        return str(target)

    def get(self, remote_path, local_dir):
        source = Path(remote_path)
        if not source.exists():
            raise HostError(f"local: {remote_path} does not exist")
        target = Path(local_dir) / source.name
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
        return target

    def rmtree(self, remote_path):
        shutil.rmtree(remote_path, ignore_errors=True)

    def check(self):
        return None
