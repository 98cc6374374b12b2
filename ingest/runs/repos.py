"""Where a repository's checkout is, for the commands and the worker (a range job's repo) that look
refs up in it, and the worker's own check that a spec's code comes from a checkout the config
names. It looks at this machine's files: the dashboard's form leaves that to the worker."""

from __future__ import annotations

import os

from .spec import OWN_CHECKOUT, Config, RunSpec, find_code_problem, find_import_problem

ROOT = OWN_CHECKOUT  # this checkout: the reference workload's own repo


def locate_repo(repo: str | None, config: Config, host_name: str = "local",
                repo_path: str | None = None) -> tuple[str | None, str | None]:
    """(repo name, checkout path on the host) for a repo given as a config [repos] name or as
    ""/"stepwatch" for this checkout; `repo_path` names the checkout of `repo` outright (for
    commands that only read history with git: `ingest check`, `import --commit`). The path is
    None when it is not known: a name the config does not name, or the path of some other
    checkout, is not looked for (code runs only from what the config names)."""
    if repo_path:
        path = os.path.abspath(repo_path)
        return repo or os.path.basename(path.rstrip("/")), path
    if repo in config.repos:
        return repo, config.repos[repo].path
    on_this_machine = config.host(host_name).ssh is None
    if repo in (None, "", "stepwatch") and on_this_machine:
        return "stepwatch", str(ROOT)
    return repo or None, None


def check_code_source(spec: RunSpec, config: Config) -> None:
    """The worker's check, before any git or engine runs, of a spec however it was made (parsed
    from a job row, built by a caller): its code comes from a repository the config names or, for
    the reference engine, this checkout; an import's path lies under the config's import roots.
    Raises SpecError naming the repo or path (spec.find_code_problem, find_import_problem)."""
    if spec.engine == "import":
        find_import_problem(spec.path or "", config)
    else:
        find_code_problem(spec.engine, spec.repo, spec.repo_path, config)
