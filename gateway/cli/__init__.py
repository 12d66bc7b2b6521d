"""The switchyard command line: every command (``commands``), the local fleet it launches
(``up``, ``quickstart``, ``localproc``) and the admin API client (``admin_client``)."""

from gateway.cli.commands import main

__all__ = ["main"]
