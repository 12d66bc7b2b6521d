"""Failures the fuzz run found that wait for a fix outside the request parser, each matched
by what its replies look like so the run stays green meanwhile, and each reproduced by a
strict xfail in ``test_known_bugs.py`` (which fails once the bug is fixed: then delete both).

Example::

    if not any(bug.matches(case, reply) for bug in KNOWN_BUGS): ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.fuzz.http_cases import Case
from tests.fuzz.wire import Reply


@dataclass(frozen=True)
class KnownBug:
    name: str  # the strict xfail that reproduces it is test_<name>
    matches: Callable[[Case, Reply | None], bool]


# Found and fixed: admin bodies with a bad Content-Encoding, /admin/usage times out of range,
# an unusual Expect on an unrouted request, a bad Content-Encoding on a kept-alive connection
# (their reproducers stay in test_known_bugs.py as regression tests).
KNOWN_BUGS: tuple[KnownBug, ...] = ()
