"""Exceptions of the ingest package. Each message names the file and what is wrong with it."""


class IngestError(Exception):
    """Base class: a problem with the user's input, reported as one line by the CLI."""


class TraceError(IngestError):
    """A trace file that cannot be read or understood (truncated, not JSON, wrong field types...)."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
