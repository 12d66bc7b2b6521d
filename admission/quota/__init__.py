"""Tenant quotas: requests and tokens per minute and concurrency, exact across replicas.

``store`` (Redis, one Lua script call per request, ``lua``), its pipelined transports
(``redis_pipe``, ``redis_batch``), the in-process fallback while Redis is unreachable
(``local``), the single-replica store without Redis (``memory``) and the value types
(``types``)."""
