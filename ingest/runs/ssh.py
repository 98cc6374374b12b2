"""A GPU host reached over SSH, through the system `ssh` client.

The remote end of ssh is a shell, so every remote command is one string built by `shlex.join`
from an argv list: no value (argument, env var, path) reaches that shell unquoted. Commands run
under a small fixed `sh` wrapper that first reports its process group, so that a timeout or a
cancel can stop the remote process tree through a second connection (killing the local ssh
client alone leaves it running). Files travel as tar streams over the same ssh: only `sh` and
`tar` are needed on the host, not rsync.

Assumes a POSIX login shell on the host (sh, bash, zsh, dash, ksh) and Linux (`/proc`).
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from .errors import CommandCancelled, CommandFailed, CommandTimeout, HostError
from .hosts import CommandResult, Host, describe_argv, run_process
from .spec import HostConfig

CONNECT_TIMEOUT_S = 10
KILL_GRACE_S = 5

# $0 is a per-run token. Prints "<token> group <pgid>" when it leads its process group (as it
# does under sshd, which starts each session in a new session), else "<token> pid <pid>";
# then enters the working directory ($1, may be empty) and runs the rest, stderr merged.
_WRAPPER = """exec 2>&1
if [ "$(cut -d' ' -f5 /proc/$$/stat 2>/dev/null)" = "$$" ]; then echo "$0 group $$"; else echo "$0 pid $$"; fi
if [ -n "$1" ]; then cd "$1" || exit 125; fi
shift
"$@"
"""

# $1: group or pid, $2: its id, $3: grace seconds. TERM, then KILL what still runs after the
# grace. Zombies do not count: an orphan's zombie waits for init, which may be slow to reap.
# dash's kill takes no "--": "kill -TERM -PGID" is the form that both dash and bash accept.
_KILLER = """kind=$1 id=$2 grace=$3
if [ "$kind" = group ]; then target="-$id"; else target="$id"; fi
running() {
  [ -d /proc/self ] || { kill -0 "$target" 2>/dev/null; return; }
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    set -- ${line##*) }
    if [ "$kind" = group ]; then [ "$3" = "$id" ]; else [ "$f" = "/proc/$id/stat" ]; fi || continue
    [ "$1" != Z ] && return 0
  done
  return 1
}
kill -TERM "$target" 2>/dev/null || exit 0
i=0
while running; do
  if [ "$i" -ge "$((grace * 10))" ]; then kill -KILL "$target" 2>/dev/null; exit 0; fi
  sleep 0.1
  i=$((i + 1))
done
exit 0
"""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# ssh's own messages, by what they mean for the user.
_UNREACHABLE = ("connection refused", "no route to host", "connection timed out", "timed out",
                "could not resolve hostname", "name or service not known", "network is unreachable",
                "connection closed by", "connection reset by", "kex_exchange_identification")
_AUTH = ("permission denied", "too many authentication failures", "no more authentication methods",
         "load key", "identity file")


def describe_ssh_failure(stderr: str) -> str:
    """`unreachable: <ssh's line>`, `authentication failed: ...` or `cannot connect: ...`."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "ssh gave no message"
    text = stderr.lower()
    if "host key verification failed" in text or "remote host identification has changed" in text:
        return f"host key verification failed: {last}"
    if any(s in text for s in _AUTH):
        return f"authentication failed: {last}"
    if any(s in text for s in _UNREACHABLE):
        return f"unreachable: {last}"
    return f"cannot connect: {last}"


def to_remote_path(path: str) -> str:
    """A path for the host's shell, where quoting stops `~` from expanding: `~/x` becomes `x`,
    relative to the login directory, which is where ssh starts."""
    if path == "~":
        return "."
    if path.startswith("~/"):
        return path[2:] or "."
    return path


class SSHHost(Host):
    """A host reached with `ssh [options] user@host`, as configured in [hosts.NAME]."""

    def __init__(self, config: HostConfig, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 kill_grace_s: int = KILL_GRACE_S):
        if not config.ssh or config.ssh.startswith("-"):
            raise HostError(f"host {config.name}: {config.ssh!r} is not user@host")
        self.config = config
        self.name = config.name
        self.connect_timeout_s = connect_timeout_s
        self.kill_grace_s = kill_grace_s  # between TERM and KILL when stopping a remote command

    # -- ssh command lines ---------------------------------------------------------------------

    def describe(self) -> str:
        return f"host {self.name} ({self.config.ssh}:{self.config.port})"

    def ssh_argv(self, remote_argv: list[str]) -> list[str]:
        """The local argv that runs remote_argv on the host, quoted for the host's shell."""
        c = self.config
        # ssh keeps the first value given for an option: BatchMode is fixed, the config's
        # options come next, the defaults last.
        argv = ["ssh", "-o", "BatchMode=yes"]
        for opt in c.ssh_options:
            argv += ["-o", opt]
        argv += ["-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout_s))}",
                 "-o", "StrictHostKeyChecking=accept-new",
                 "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                 "-o", "LogLevel=ERROR", "-p", str(c.port)]
        if c.identity_file:
            argv += ["-i", os.path.expanduser(c.identity_file), "-o", "IdentitiesOnly=yes"]
        return argv + ["--", c.ssh, shlex.join(remote_argv)]

    def _need_ssh(self) -> None:
        if shutil.which("ssh") is None:
            raise HostError(f"{self.describe()}: the ssh client is not installed on this machine")

    def _connect_error(self, stderr: str) -> HostError:
        return HostError(f"{self.describe()}: {describe_ssh_failure(stderr)}")

    def _call(self, remote_argv: list[str], *, timeout_s: float = 60) -> subprocess.CompletedProcess:
        """A short remote command; raises HostError when ssh cannot connect (exit code 255)."""
        self._need_ssh()
        try:
            proc = subprocess.run(self.ssh_argv(remote_argv), stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, errors="replace", timeout=timeout_s + self.connect_timeout_s)
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.describe()}: no answer within {timeout_s + self.connect_timeout_s:.0f} s "
                            f"to {describe_argv(remote_argv)}") from None
        if proc.returncode == 255:
            raise self._connect_error(proc.stderr)
        return proc

    # -- Host ------------------------------------------------------------------------------------

    def check(self):
        python = self.config.python
        proc = self._call(["sh", "-c", 'command -v "$1" >/dev/null 2>&1 || exit 3', "stepwatch-check", python],
                          timeout_s=30)
        if proc.returncode == 3:
            raise HostError(f"{self.describe()}: python {python!r} is not on the host's PATH")
        if proc.returncode != 0:
            raise HostError(f"{self.describe()}: cannot run a command: {_last_line(proc.stderr or proc.stdout)}")

    def run(self, argv, *, cwd=None, env=None, timeout_s=None, on_line=None, should_stop=None, check=True):
        argv = [str(a) for a in argv]
        if not argv:
            raise HostError(f"{self.describe()}: empty command")
        env_args = []
        for key, value in (env or {}).items():
            if not _ENV_NAME.fullmatch(key):
                raise HostError(f"{self.describe()}: {key!r} is not an environment variable name")
            env_args.append(f"{key}={value}")
        command = (["env", *env_args] if env_args else []) + argv
        token = f"stepwatch-run-{secrets.token_hex(6)}"
        remote = ["exec", "sh", "-c", _WRAPPER, token, to_remote_path(cwd) if cwd else "", *command]
        self._need_ssh()
        return _RemoteRun(self, token, argv, timeout_s, on_line, should_stop).run(self.ssh_argv(remote), check)

    def mkdtemp(self, prefix="stepwatch-"):
        if "/" in prefix or prefix.startswith("-"):
            raise HostError(f"{self.describe()}: {prefix!r} is not a file name prefix")
        workdir = to_remote_path(self.config.workdir)
        # Absolute, even for a workdir relative to the login directory: callers pass it on.
        proc = self._call(["sh", "-c", 'mkdir -p "$1" && d=$(mktemp -d "$1/$2XXXXXX") && cd "$d" && pwd -P',
                           "stepwatch-mkdtemp", workdir, prefix])
        path = _last_line(proc.stdout) if proc.stdout.strip() else ""
        if proc.returncode != 0 or not path:
            raise HostError(f"{self.describe()}: cannot make a directory in {workdir}: "
                            f"{_last_line(proc.stderr)}")
        return path

    def put(self, local, remote_dir):
        local = Path(local)
        if not local.exists():
            raise HostError(f"{self.describe()}: cannot copy {local}: no such file or directory")
        target = posixpath.join(remote_dir, local.name)
        self._need_ssh()
        remote = ["sh", "-c", 'mkdir -p "$1" && tar -x -f - -C "$1"', "stepwatch-put", to_remote_path(remote_dir)]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.ssh_argv(remote), stdin=subprocess.PIPE, stdout=err, stderr=err)
            problem = None
            try:
                with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                    tar.add(local, arcname=local.name, filter=_as_plain_owner)
            except (BrokenPipeError, ConnectionResetError):
                problem = "the host stopped reading"
            except OSError as e:
                problem = f"{e.filename or local}: {e.strerror}"
            finally:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            proc.wait()
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if proc.returncode == 255:
            raise HostError(f"{self.describe()}: cannot copy {local} to {target}: {describe_ssh_failure(stderr)}")
        if problem or proc.returncode != 0:
            raise HostError(f"{self.describe()}: cannot copy {local} to {target}: "
                            f"{_why(proc.returncode, stderr, problem)}")
        return target

    def get(self, remote_path, local_dir):
        name = posixpath.basename(remote_path.rstrip("/"))
        if not name or name in (".", "..", "~"):
            raise HostError(f"{self.describe()}: cannot copy {remote_path!r}: name a file or directory")
        parent = to_remote_path(posixpath.dirname(remote_path.rstrip("/")) or ".")
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        self._need_ssh()
        # The token line marks where the tar stream starts, after anything a login script printed.
        token = f"stepwatch-tar-{secrets.token_hex(6)}"
        remote = ["sh", "-c", 'cd "$1" && [ -e "$2" ] || { echo "$1/$2: no such file or directory" >&2; exit 2; }; '
                  'echo "$3"; exec tar -c -f - "./$2"', "stepwatch-get", parent, name, token]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.ssh_argv(remote), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err)
            problem = None
            try:
                if _skip_past(proc.stdout, f"{token}\n".encode()):
                    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                        tar.extractall(local_dir, filter="data")  # no absolute paths, no ".."
                else:
                    problem = "no tar stream came back"
            except (tarfile.TarError, OSError) as e:
                problem = str(e)
            finally:
                proc.stdout.close()
            proc.wait()
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if proc.returncode == 255:
            raise HostError(f"{self.describe()}: cannot copy {remote_path}: {describe_ssh_failure(stderr)}")
        if proc.returncode != 0 or problem:
            raise HostError(f"{self.describe()}: cannot copy {remote_path}: {_why(proc.returncode, stderr, problem)}")
        return local_dir / name

    def rmtree(self, remote_path):
        path = to_remote_path(remote_path).rstrip("/")
        if path in ("", ".", "..") or posixpath.normpath(path) in ("/", "."):
            raise HostError(f"{self.describe()}: refusing to remove {remote_path!r}")
        proc = self._call(["rm", "-rf", "--", path])
        if proc.returncode != 0:
            raise HostError(f"{self.describe()}: cannot remove {remote_path}: {_last_line(proc.stderr)}")


class _RemoteRun:
    """One remote command: learns its process group from the wrapper's first line, stops it
    through a second connection on a timeout or a cancel, and reports as LocalHost does."""

    def __init__(self, host: SSHHost, token: str, argv: list[str], timeout_s, on_line, should_stop):
        self.host, self.token, self.argv = host, token, argv
        self.timeout_s, self.on_line, self.should_stop = timeout_s, on_line, should_stop
        self.target: tuple[str, str] | None = None  # ("group" or "pid", id) on the host
        self.started = threading.Event()
        self.reason: str | None = None  # "timeout" or "cancelled"
        self.stop_problem: str | None = None
        self.began = 0.0

    def line(self, text: str) -> None:
        if self.target is None:
            parts = text.split(" ")
            if len(parts) == 3 and parts[0] == self.token and parts[1] in ("group", "pid") and parts[2].isdigit():
                self.target = (parts[1], parts[2])
                self.started.set()
                return
        if self.on_line is not None:
            self.on_line(text)

    def stop_now(self) -> bool:
        if self.reason is None:
            if self.timeout_s is not None and time.monotonic() - self.began > self.timeout_s:
                self.reason = "timeout"
            elif self.should_stop is not None and self.should_stop():
                self.reason = "cancelled"
            else:
                return False
        self.kill_remote()
        return True

    def kill_remote(self) -> None:
        # A command that has not reported yet is still connecting: give it the connect timeout.
        if not self.started.wait(self.host.connect_timeout_s + 2):
            self.stop_problem = "it never reported its process group, so only the local ssh was stopped"
            return
        kind, ident = self.target
        try:
            grace = self.host.kill_grace_s
            proc = self.host._call(["sh", "-c", _KILLER, "stepwatch-stop", kind, ident, str(int(grace))],
                                   timeout_s=grace + 10)
            if proc.returncode != 0:
                self.stop_problem = _last_line(proc.stderr)
        except HostError as e:
            self.stop_problem = str(e)

    def run(self, ssh_argv: list[str], check: bool) -> CommandResult:
        host, what = self.host, describe_argv(self.argv)
        self.began = time.monotonic()
        try:
            result = run_process(ssh_argv, shown_argv=self.argv, cwd=None, env=None, timeout_s=None,
                                 on_line=self.line, should_stop=self.stop_now, check=False)
        except CommandCancelled as e:  # stop_now said so: self.reason says why
            result = e.result
        except CommandFailed as e:  # ssh itself did not start
            raise HostError(f"{host.describe()}: {e}") from None
        result = CommandResult(self.argv, result.returncode, self.clean(result.output), result.seconds)
        if self.reason is not None:
            note = f" (the remote process may still run: {self.stop_problem})" if self.stop_problem else ""
            if self.reason == "timeout":
                raise CommandTimeout(f"{host.name}: timed out after {self.timeout_s:.0f} s: {what}{note}", result)
            raise CommandCancelled(f"{host.name}: cancelled: {what}{note}", result)
        if self.target is None and result.returncode == 255:
            raise host._connect_error(result.output)
        if self.target is None and result.returncode != 0:
            raise HostError(f"{host.describe()}: cannot start {what}: {_last_line(result.output)}")
        if check and result.returncode != 0:
            raise CommandFailed(f"{host.name}: {_last_line(result.output)} "
                                f"(exit code {result.returncode} of {what})", result)  # the cause first
        return result

    def clean(self, output: str) -> str:
        """The output without the wrapper's first line."""
        if self.target is None:
            return output
        marker = f"{self.token} {self.target[0]} {self.target[1]}\n"
        return output.replace(marker, "", 1)


def _skip_past(stream, token: bytes, limit: int = 1 << 20) -> bool:
    """Read up to and including token; False when the stream ends (or runs on) without it."""
    seen = bytearray()
    while not seen.endswith(token):
        byte = stream.read(1)
        if not byte or len(seen) > limit:
            return False
        seen += byte
    return True


def _as_plain_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files arrive owned by whoever unpacks them, not by this machine's uid numbers."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _why(returncode: int, stderr: str, problem: str | None) -> str:
    """A failed transfer's reason: the host's message when it failed, else ours."""
    if returncode != 0 and stderr.strip():
        return _last_line(stderr)
    return problem or f"exit code {returncode}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"
