"""The Host a config names: this machine (`LocalHost`) or an SSH target (`SSHHost`).

A module of its own because it needs both kinds: ingest.runs.ssh builds on ingest.runs.hosts, so
the choice between them cannot live in either without a cycle."""

from __future__ import annotations

from .hosts import Host, LocalHost
from .spec import Config, HostConfig
from .ssh import SSHHost


def make_host(config: HostConfig) -> Host:
    """The Host for a [hosts.NAME] entry: this machine when it names no ssh target."""
    return LocalHost() if config.ssh is None else SSHHost(config)


def make_host_for(config: Config, name: str) -> Host:
    """The Host of the config's [hosts.NAME] entry (`local` when the config names none)."""
    return make_host(config.host(name))
