"""Where a repository's checkout is, for the commands and the worker (a range job's repo) that look
refs up in it. It looks at this machine's files: the dashboard's form leaves that to the worker."""

from __future__ import annotations

import os
from pathlib import Path

from .spec import Config

ROOT = Path(__file__).resolve().parents[2]  # this checkout: the reference workload's own repo


def locate_repo(repo: str | None, config: Config, host_name: str = "local",
                repo_path: str | None = None) -> tuple[str | None, str | None]:
    """(repo name, checkout path on the host) for a repo given as a config [repos] name, as the
    path of a checkout on this machine, or as ""/"stepwatch" for this checkout; `repo_path`
    names the checkout of `repo` outright. The path is None when it is not known."""
    if repo_path:
        path = os.path.abspath(repo_path)
        return repo or os.path.basename(path.rstrip("/")), path
    if repo in config.repos:
        return repo, config.repos[repo].path
    on_this_machine = config.host(host_name).ssh is None
    if repo in (None, "", "stepwatch") and on_this_machine:
        return "stepwatch", str(ROOT)
    if repo and on_this_machine and os.path.isdir(repo):
        path = os.path.abspath(repo)
        return os.path.basename(path.rstrip("/")), path
    return repo or None, None
