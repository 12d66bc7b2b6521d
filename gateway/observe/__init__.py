"""Observability of the gateway: a span per request and per wait (OTLP), Prometheus metrics,
wait histograms and the waits report behind ``/admin/waits``."""
