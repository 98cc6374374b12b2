"""Git facts a run needs, asked of the host that holds the checkout: a ref resolved to a full
sha with its date, author and subject; a range along first-parent history; worktrees.

Refs are checked (spec.check_ref) and always passed after `--end-of-options`, so no ref can be
read as an option; every command is an argv list."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CommandFailed, SpecError
from .hosts import Host
from .spec import check_ref

_SEP = "\x1f"


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    committed_at: str  # ISO 8601
    author: str
    subject: str
    seq: int  # commits on the first-parent chain up to and including this one


def _git(host: Host, repo: str, *args: str) -> str:
    return host.run(["git", "-C", repo, *args], timeout_s=120).output


def describe_commit(host: Host, repo: str, sha: str) -> CommitInfo:
    out = _git(host, repo, "show", "-s", f"--format=%H{_SEP}%cI{_SEP}%an{_SEP}%s", "--end-of-options", sha)
    full, date, author, subject = out.strip().split(_SEP, 3)
    seq = int(_git(host, repo, "rev-list", "--first-parent", "--count", "--end-of-options", full).strip())
    return CommitInfo(full, date, author, subject, seq)


def resolve_ref(host: Host, repo: str, ref: str) -> CommitInfo:
    """The commit a ref names; SpecError when it names none."""
    check_ref(ref)
    try:
        sha = _git(host, repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}").strip()
    except CommandFailed as e:
        if "not a git repository" in (e.result.output if e.result else "").lower() or "cannot change to" in str(e):
            raise SpecError(f"repo {repo}: not a git checkout on host {host.name}") from None
        raise SpecError(f"ref {ref!r}: no such commit in {repo} on host {host.name}") from None
    return describe_commit(host, repo, sha)


def list_first_parent(host: Host, repo: str, range_spec: str, every: int = 1) -> list[CommitInfo]:
    """Commits of A..B along B's first-parent history, oldest first; every K-th one, always
    keeping the last (B). `A..B` excludes A, as git does; a single ref means just that commit."""
    if every <= 0:
        raise SpecError(f"--every {every}: must be a positive integer")
    if ".." not in range_spec:
        return [resolve_ref(host, repo, range_spec)]
    start, _, end = range_spec.partition("..")
    first, last = resolve_ref(host, repo, start), resolve_ref(host, repo, end)
    shas = _git(host, repo, "rev-list", "--first-parent", "--reverse", "--end-of-options",
                f"^{first.sha}", last.sha).split()
    if not shas:
        raise SpecError(f"range {range_spec!r}: no commits between them on {end}'s first-parent history")
    picked = shas[every - 1::every]
    if not picked or picked[-1] != shas[-1]:
        picked.append(shas[-1])
    return [describe_commit(host, repo, sha) for sha in picked]


def list_after(host: Host, repo: str, good: str, bad: str) -> list[str]:
    """Shas after `good` up to and including `bad` on bad's first-parent line, oldest first."""
    return _git(host, repo, "rev-list", "--first-parent", "--reverse", "--end-of-options", f"^{good}", bad).split()


def add_worktree(host: Host, repo: str, sha: str, path: str) -> None:
    _git(host, repo, "worktree", "add", "--detach", "--force", "--end-of-options", path, sha)


def remove_worktree(host: Host, repo: str, path: str) -> None:
    host.run(["git", "-C", repo, "worktree", "remove", "--force", "--end-of-options", path], check=False,
             timeout_s=120)
    host.run(["git", "-C", repo, "worktree", "prune"], check=False, timeout_s=120)
