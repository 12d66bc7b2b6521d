"""A gateway's SLO admission over one 4-slot worker, and a principal to admit: the in-process
set-up the admission tests that drive ``admission.waiting_room.SloAdmission`` share."""

from __future__ import annotations

import asyncio

import pytest

from admission.tiers import DEFAULT_TIERS
from admission.waiting_room import Admitted, SloAdmission
from backends.fleet.registry import Backend, BackendRegistry
from gateway.auth import Principal
from gateway.keystore import ApiKey, Limits, Tenant
from gateway.router import Router
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.profiles import profile_by_name
from routing.types import BackendProfile


def one_worker_slo() -> tuple[SloAdmission, Backend]:
    """SLO admission with the default tiers over one worker ``w0`` serving ``m``, 4 slots."""
    worker = Backend(name="w0", url="http://127.0.0.1:9", models=frozenset({"m"}),
                     profile=BackendProfile(max_batch=4))
    router = Router(BackendRegistry([worker]), profile_by_name("least_load"),
                    ExactPrefixIndex(block_size=16), ApproxPrefixIndex(), {}, seed=1)
    return SloAdmission(DEFAULT_TIERS, router), worker


def principal() -> Principal:
    """Tenant ``t`` (interactive tier, model ``m``, no limits) with key ``k``."""
    tenant = Tenant(id="t", name="t", tier="interactive", models=("m",), limits=Limits(),
                    enabled=True, created_at=0.0)
    key = ApiKey(id="k", tenant_id="t", name="k", digest="0" * 64, hint="", created_at=0.0,
                 expires_at=None, revoked_at=None, tier=None)
    return Principal(tenant=tenant, key=key)


async def cancel_waiting(task: asyncio.Task[Admitted]) -> None:
    """Cancel a request still waiting in admission (its client left) and see it end so."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
