"""The built-in routing plugins: filters, scorers, pickers, the TTFT cost model, session
stickiness and cache room. Importing this package registers every one of them
(``routing.registry``); a plugin of one's own registers the same way, in its own module."""

from routing.plugins import cache_room, filters, pickers, scorers, session, ttft

__all__ = ["cache_room", "filters", "pickers", "scorers", "session", "ttft"]
