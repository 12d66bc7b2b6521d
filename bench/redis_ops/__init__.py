"""Redis calls and gateway CPU per request, on one Redis and on a Redis Cluster."""
