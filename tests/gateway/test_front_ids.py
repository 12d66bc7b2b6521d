"""Request ids made without a system call: unique within a process, and across processes,
forked ones included (a forked child draws its own random half)."""

from __future__ import annotations

import multiprocessing
import re

from gateway.front import new_request_id, own_request_id

ID_RE = re.compile(r"^req-[0-9a-f]{24}$")


def test_request_ids_have_the_documented_shape_and_never_repeat() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(ID_RE.match(i) for i in ids), ids[:3]
    assert len(set(ids)) == len(ids)


def test_a_shared_client_id_still_gives_each_request_its_own_lease_id() -> None:
    first, second = own_request_id("client-id"), own_request_id("client-id")
    assert first != second
    assert first.startswith("client-id#") and second.startswith("client-id#")


def _child_id(conn: multiprocessing.connection.Connection) -> None:
    conn.send(new_request_id())
    conn.close()


def test_a_forked_child_draws_its_own_random_half() -> None:
    parent_id = new_request_id()
    context = multiprocessing.get_context("fork")
    ids = []
    for _ in range(2):
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_child_id, args=(sender,))
        child.start()
        ids.append(receiver.recv())
        child.join(timeout=30)
        assert child.exitcode == 0
    prefixes = {i[4:16] for i in [parent_id, *ids]}
    assert len(prefixes) == 3, (parent_id, ids)  # each process its own half
