"""Hosts: LocalHost, and SSHHost against a real sshd on 127.0.0.1 (scripts/start_sshd.sh).

The sshd is the session fixture `sshd` (tests/conftest.py): the SSH tests fail in CI (CI=true)
when it cannot be started, and are skipped with the script's reason elsewhere. "Remote" processes
run on this machine, so a second connection checks what is left of them by reading /proc for a
unique marker in their command line; the marker is passed in two pieces so that the checking
command does not match itself.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.runs.connect import make_host
from ingest.runs.errors import CommandCancelled, CommandFailed, CommandTimeout, HostError
from ingest.runs.hosts import LocalHost
from ingest.runs.spec import HostConfig
from ingest.runs.ssh import SSHHost, describe_ssh_failure

# Prints the pids of live (non-zombie) processes whose command line holds the marker, the
# marker being argv[1:] joined, so that this process's own command line does not hold it.
FIND_LIVE = """
import os, sys
marker = "".join(sys.argv[1:])
live = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        continue
    if marker in cmdline and state != "Z":
        live.append(pid)
print(" ".join(live))
"""

# Sleeps in a grandchild and in itself, both carrying the marker; says "ready" first.
SLEEPER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
print("ready", flush=True)
time.sleep(60)
"""


def new_marker() -> str:
    return f"stepwatch-test-{secrets.token_hex(6)}"


def split_marker(marker: str) -> list[str]:
    return [marker[:5], marker[5:]]


def live_pids_here(marker: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", FIND_LIVE, *split_marker(marker)], capture_output=True,
                         text=True, check=True).stdout
    return out.split()


# Prints "first", waits until the file argv[1] exists (the caller makes it when "first" reaches it),
# then prints "second": that "second" follows proves the first line arrived while the command ran.
# Gives up after 300 s and prints "never released" instead.
SAYS_FIRST_THEN_WAITS = """
import os, sys, time
print("first", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
print("second" if os.path.exists(sys.argv[1]) else "never released")
"""


def release_on_first(release: Path, seen: list[str]):
    """An on_line sink that keeps the lines and makes the release file when "first" arrives."""
    def sink(line: str) -> None:
        seen.append(line)
        if line == "first":
            release.touch()
    return sink


def wait_until_gone(find, marker: str, within_s: float = 120.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := find(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def write_tree(root: Path) -> None:
    (root / "sub dir" / "deeper").mkdir(parents=True)
    (root / "plain.txt").write_text("hello\n")
    (root / "sub dir" / "name with 'quotes' and $(x).bin").write_bytes(bytes(range(256)) * 40)
    (root / "sub dir" / "deeper" / "empty").write_bytes(b"")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "big.bin").write_bytes(os.urandom(3 << 20))


def tree_contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


# -- LocalHost ----------------------------------------------------------------------------------


def test_local_streams_lines_before_the_command_ends(tmp_path):
    seen = []
    release = tmp_path / "release"
    result = LocalHost().run([sys.executable, "-c", SAYS_FIRST_THEN_WAITS, str(release)],
                             on_line=release_on_first(release, seen))
    assert seen == ["first", "second"]  # "first" reached us while the command waited for us to see it
    assert result.output == "first\nsecond\n"


def test_local_exit_code_and_failure():
    host = LocalHost()
    argv = ["sh", "-c", "echo out; echo err >&2; exit 3"]
    result = host.run(argv, check=False)
    assert result.returncode == 3 and result.output.splitlines() == ["out", "err"]
    with pytest.raises(CommandFailed, match=r"^err \(exit code 3 of sh -c "):  # the cause first, then the argv
        host.run(argv)


def test_local_env_and_cwd(tmp_path):
    cwd = tmp_path / "a dir"
    cwd.mkdir()
    code = "import os, json; print(json.dumps([os.getcwd(), os.environ['STEPWATCH_T']]))"
    result = LocalHost().run([sys.executable, "-c", code], cwd=str(cwd), env={"STEPWATCH_T": "x $(y) 'z'"})
    assert json.loads(result.output) == [str(cwd), "x $(y) 'z'"]


def test_local_missing_program_and_missing_working_directory_are_told_apart(tmp_path):
    # Popen raises FileNotFoundError for both; the message named the program for a missing cwd too.
    gone = tmp_path / "gone"
    with pytest.raises(CommandFailed, match=rf"^{gone}: no such working directory \(for {sys.executable} -c 1\)$"):
        LocalHost().run([sys.executable, "-c", "1"], cwd=str(gone))
    with pytest.raises(CommandFailed, match=r"^stepwatch-no-such-program: no such program$"):
        LocalHost().run(["stepwatch-no-such-program"], cwd=str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandFailed, match=r"file: not a directory \(the working directory of "):
        LocalHost().run([sys.executable, "-c", "1"], cwd=str(tmp_path / "file"))


@pytest.mark.slow
def test_local_timeout_kills_the_process_group_with_its_grandchild():
    marker = new_marker()
    started = time.monotonic()
    # 5 s: time for a loaded machine to start the command and see "ready"; it sleeps 60 s
    with pytest.raises(CommandTimeout, match="timed out after 5 s") as caught:
        LocalHost().run([sys.executable, "-c", SLEEPER, marker], timeout_s=5)
    assert time.monotonic() - started < 40
    assert "ready" in caught.value.result.output
    assert wait_until_gone(live_pids_here, marker) == []


def test_local_cancel_stops_the_process_group():
    marker = new_marker()
    seen = []
    with pytest.raises(CommandCancelled, match="cancelled"):
        LocalHost().run([sys.executable, "-c", SLEEPER, marker], on_line=seen.append, should_stop=lambda: bool(seen))
    assert seen == ["ready"]
    assert wait_until_gone(live_pids_here, marker) == []


def test_local_put_and_get_files_and_directories(tmp_path):
    host = LocalHost()
    source = tmp_path / "tree"
    write_tree(source)
    remote = host.mkdtemp()
    try:
        assert host.put(source, remote) == f"{remote}/tree"
        assert host.put(source / "plain.txt", remote) == f"{remote}/plain.txt"
        back = tmp_path / "back"
        back.mkdir()
        assert host.get(f"{remote}/tree", back) == back / "tree"
        assert host.get(f"{remote}/plain.txt", back) == back / "plain.txt"
        assert tree_contents(back / "tree") == tree_contents(source)
        assert (back / "plain.txt").read_text() == "hello\n"
        with pytest.raises(HostError, match="does not exist"):
            host.get(f"{remote}/missing", back)
    finally:
        host.rmtree(remote)
    assert not Path(remote).exists()


def test_make_host_picks_local_or_ssh():
    assert isinstance(make_host(HostConfig("here")), LocalHost)
    host = make_host(HostConfig("gpu1", "root@10.0.0.5", 2200, "~/.ssh/id_gpu", ssh_options=("Compression=yes",)))
    assert isinstance(host, SSHHost) and host.name == "gpu1"
    argv = host.ssh_argv(["echo", "a b", "$(y)", "it's"])
    assert argv[-3:-1] == ["--", "root@10.0.0.5"]
    assert shlex.split(argv[-1]) == ["echo", "a b", "$(y)", "it's"]  # one string, each element quoted
    assert argv[argv.index("-p") + 1] == "2200"
    assert os.path.expanduser("~/.ssh/id_gpu") in argv
    # ssh keeps an option's first value: the config's options come before the defaults.
    assert argv.index("Compression=yes") < argv.index("StrictHostKeyChecking=accept-new")


@pytest.mark.parametrize("stderr, kind", [
    ("ssh: connect to host 127.0.0.1 port 1: Connection refused\r\n", "unreachable"),
    ("ssh: Could not resolve hostname nohost: Name or service not known\n", "unreachable"),
    ("ssh: connect to host 10.255.255.1 port 22: Connection timed out\n", "unreachable"),
    ("root@127.0.0.1: Permission denied (publickey).\n", "authentication failed"),
    ("Host key verification failed.\n", "host key verification failed"),
    ("", "cannot connect"),
])
def test_ssh_failures_are_named_by_what_they_mean(stderr, kind):
    message = describe_ssh_failure(stderr)
    assert message.startswith(f"{kind}: ") and "\n" not in message


# -- SSHHost against a real sshd ------------------------------------------------------------


@pytest.fixture(scope="session")
def remote_root(tmp_path_factory) -> Path:
    """The "remote" side's scratch space (the same machine), with a space in its path."""
    return tmp_path_factory.mktemp("remote") / "work dir"


def ssh_config(sshd: dict[str, str], root: Path, **changes) -> HostConfig:
    base = dict(name="testhost", ssh=f"{sshd['STEPWATCH_TEST_SSH_USER']}@127.0.0.1",
                port=int(sshd["STEPWATCH_TEST_SSH_PORT"]), identity_file=sshd["STEPWATCH_TEST_SSH_KEY"],
                workdir=str(root), ssh_options=(f"UserKnownHostsFile={sshd['STEPWATCH_TEST_SSH_KNOWN_HOSTS']}",))
    return HostConfig(**{**base, **changes})


@pytest.fixture
def host(sshd, remote_root) -> SSHHost:
    return SSHHost(ssh_config(sshd, remote_root), kill_grace_s=1)


def live_pids_there(host: SSHHost, marker: str) -> list[str]:
    return host.run(["python3", "-c", FIND_LIVE, *split_marker(marker)]).output.split()


@pytest.mark.slow
def test_ssh_check_passes(host):
    host.check()


@pytest.mark.slow
def test_ssh_argv_arrives_verbatim_and_nothing_runs(host, tmp_path):
    pwned = tmp_path / "pwned"
    victim = tmp_path / "x"
    victim.mkdir()
    args = ["a b", f"$(touch {pwned})", f"`touch {pwned}`", ";rm -rf x", f"&& touch {pwned}", f"| tee {pwned}",
            f"> {pwned}", "it's", 'say "hi"', "line1\nline2", "tab\there", "", "*", "~", "$HOME", "\\", "--help",
            "-c", "ünï", "{a,b}", "#comment", "!!"]
    result = host.run(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *args], cwd=str(tmp_path))
    assert json.loads(result.output) == args
    assert not pwned.exists() and victim.is_dir()


@pytest.mark.slow
def test_ssh_env_and_cwd_with_spaces(host, tmp_path):
    cwd = tmp_path / "a dir; with $(spaces)"
    cwd.mkdir()
    value = f"v a l $(touch {tmp_path}/pwned) 'q' \"d\" `id`"
    code = "import os, json; print(json.dumps([os.getcwd(), os.environ['STEPWATCH_T'], os.environ['OTHER']]))"
    result = host.run(["python3", "-c", code], cwd=str(cwd), env={"STEPWATCH_T": value, "OTHER": ""})
    assert json.loads(result.output) == [str(cwd), value, ""]
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(HostError, match="not an environment variable name"):
        host.run(["true"], env={"A B": "1"})
    # Quoting keeps "~" from expanding, so a leading "~" in a cwd is read as the login directory.
    home = host.run(["sh", "-c", 'echo "$HOME"']).output.strip()
    assert host.run(["pwd", "-P"], cwd="~").output.strip() == os.path.realpath(home)


@pytest.mark.slow
def test_ssh_exit_code_output_and_failure(host):
    argv = ["sh", "-c", "echo out; echo err >&2; exit 3"]
    result = host.run(argv, check=False)
    assert result.returncode == 3 and result.output.splitlines() == ["out", "err"]
    with pytest.raises(CommandFailed, match=r"^testhost: err \(exit code 3 of sh -c "):
        host.run(argv)
    with pytest.raises(CommandFailed, match="exit code 125"):
        host.run(["true"], cwd="/nonexistent/stepwatch")


@pytest.mark.slow
def test_ssh_streams_lines_before_the_command_ends(host, tmp_path):
    seen = []
    release = tmp_path / "release"  # the "remote" command runs on this machine: it sees the file
    result = host.run(["python3", "-c", SAYS_FIRST_THEN_WAITS, str(release)], on_line=release_on_first(release, seen))
    assert seen == ["first", "second"]  # "first" came while the command was still running
    assert result.output == "first\nsecond\n"  # without the wrapper's own line


@pytest.mark.slow
def test_ssh_put_get_round_trip(host, tmp_path):
    source = tmp_path / "tree"
    write_tree(source)
    remote = host.mkdtemp("roundtrip-")
    assert remote.startswith(host.config.workdir + "/roundtrip-")
    assert host.put(source, remote) == f"{remote}/tree"
    assert host.put(source / "plain.txt", f"{remote}/made/on demand") == f"{remote}/made/on demand/plain.txt"
    back = tmp_path / "back"
    assert host.get(f"{remote}/tree", back) == back / "tree"
    assert host.get(f"{remote}/made/on demand/plain.txt", back) == back / "plain.txt"
    assert tree_contents(back / "tree") == tree_contents(source)
    assert (back / "plain.txt").read_text() == "hello\n"
    assert (back / "tree" / "run.sh").stat().st_mode & stat.S_IXUSR
    host.rmtree(remote)
    assert host.run(["test", "-e", remote], check=False).returncode == 1


@pytest.mark.slow
def test_ssh_transfer_failures_name_the_host_and_path(host, tmp_path):
    with pytest.raises(HostError, match=r"host testhost \(.*\): cannot copy /nonexistent/stepwatch/f: .*no such"):
        host.get("/nonexistent/stepwatch/f", tmp_path)
    with pytest.raises(HostError, match="host testhost .*cannot copy .*missing"):
        host.put(tmp_path / "missing", "/tmp")
    (tmp_path / "f").write_text("x")
    with pytest.raises(HostError, match=r"host testhost .*cannot copy .*/f to /proc/stepwatch/f"):
        host.put(tmp_path / "f", "/proc/stepwatch")
    for path in ("/", "", "~", "."):
        with pytest.raises(HostError, match="refusing"):
            host.rmtree(path)


@pytest.mark.slow
def test_ssh_timeout_kills_the_remote_process_tree(host):
    marker = new_marker()
    started = time.monotonic()
    # 5 s: time for a loaded machine to connect, start the command and see "ready"; it sleeps 60 s
    with pytest.raises(CommandTimeout, match="testhost: timed out after 5 s") as caught:
        host.run(["python3", "-c", SLEEPER, marker], timeout_s=5)
    assert time.monotonic() - started < 40
    assert "(the remote process may still run" not in str(caught.value)
    assert "ready" in caught.value.result.output
    assert wait_until_gone(lambda m: live_pids_there(host, m), marker) == []


@pytest.mark.slow
def test_ssh_cancel_kills_the_remote_process_tree(host):
    marker = new_marker()
    seen = []
    with pytest.raises(CommandCancelled, match="testhost: cancelled"):
        host.run(["python3", "-c", SLEEPER, marker], on_line=seen.append, should_stop=lambda: bool(seen))
    assert seen == ["ready"]
    assert wait_until_gone(lambda m: live_pids_there(host, m), marker) == []


@pytest.mark.slow
def test_ssh_cancel_before_the_command_has_reported_still_kills_it(host):
    marker = new_marker()
    with pytest.raises(CommandCancelled):
        host.run(["python3", "-c", SLEEPER, marker], should_stop=lambda: True)
    assert wait_until_gone(lambda m: live_pids_there(host, m), marker) == []


@pytest.mark.slow
def test_ssh_cancel_kills_a_process_that_ignores_sigterm(host):
    marker = new_marker()
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    seen = []
    started = time.monotonic()
    with pytest.raises(CommandCancelled):
        host.run(["python3", "-c", code, marker], on_line=seen.append, should_stop=lambda: bool(seen))
    assert 1 <= time.monotonic() - started < 40  # TERM, the host's 1 s grace, then KILL (not its 60 s sleep)
    assert wait_until_gone(lambda m: live_pids_there(host, m), marker) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ssh_unreachable_host_fails_fast_with_one_line(sshd, remote_root, tmp_path):
    port = free_port()
    host = SSHHost(ssh_config(sshd, remote_root, name="nowhere", port=port), connect_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(HostError) as caught:
        host.check()
    message = str(caught.value)
    assert time.monotonic() - started < 30  # refused at once: no waiting out the 60 s connect timeout
    user = sshd["STEPWATCH_TEST_SSH_USER"]
    assert message.startswith(f"host nowhere ({user}@127.0.0.1:{port}): unreachable: ") and "\n" not in message
    assert "Connection refused" in message
    with pytest.raises(HostError, match="host nowhere .*unreachable"):
        host.run(["true"])
    with pytest.raises(HostError, match="host nowhere .*unreachable"):
        host.get("/etc/hostname", tmp_path)


@pytest.mark.slow
def test_ssh_bad_key_says_authentication_failed(sshd, remote_root, tmp_path):
    key = tmp_path / "not_authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = SSHHost(ssh_config(sshd, remote_root, name="badkey", identity_file=str(key)))
    with pytest.raises(HostError, match=r"host badkey \(.*\): authentication failed: .*Permission denied") as caught:
        host.check()
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_ssh_check_names_a_missing_python(sshd, remote_root):
    host = SSHHost(ssh_config(sshd, remote_root, python="/nonexistent/python3"))
    with pytest.raises(HostError, match="host testhost .*python '/nonexistent/python3' is not on the host's PATH"):
        host.check()

