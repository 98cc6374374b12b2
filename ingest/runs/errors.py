"""Exceptions of the runs package: each names the spec field, host or command at fault."""

from ..errors import IngestError


class RunError(IngestError):
    """A run that cannot be specified, started or finished; the message says why."""


class SpecError(RunError):
    """A run spec or config file with a bad field (named in the message)."""


class HostError(RunError):
    """A host that cannot be reached, or a file that cannot be moved to or from it."""


class CommandFailed(RunError):
    """A command that exited non-zero; `result` holds its output."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class CommandTimeout(CommandFailed):
    pass


class CommandCancelled(CommandFailed):
    pass
