"""OTLP trace protobuf, written directly: the wire bytes of spans and export requests.

The SDK's encoder builds a protobuf object per span, attribute and value: about 20 µs per span on
the benchmark machine, so a traced request's five spans would cost more than half of what the
gateway spends on the request itself. This writes the same bytes (tested against the SDK's
encoder) with struct packing, and caches the encodings of names and string attributes, most of
which repeat on every request. Pure: no I/O.

Example::

    span = encode_span_fields(trace_id, span_id, parent_id, False, "routing", SpanKind.INTERNAL,
                              start_ns, end_ns, {"switchyard.routing.backend": "w1"})
    body = export_request(resource, scope, framed_span(span))  # POST to /v1/traces
    encode_request(readable_spans)                              # from SDK spans, grouped
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, StatusCode, TraceState

# The fixed-size head of a span: trace id (16 bytes, as two big-endian halves), span id and
# parent span id (8 bytes each), each after its field tag and length; then the two timestamps.
_IDS = struct.Struct(">2sQQ2sQ")
_IDS_WITH_PARENT = struct.Struct(">2sQQ2sQ2sQ")
_TIMES = struct.Struct("<BQBQ")
_TRACE = struct.Struct(">2sQQ2s")
_LOW64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_CACHE_LIMIT = 8192
_SMALL = [bytes((i,)) for i in range(128)]
# Keys, and whole attributes: most repeat on every request.
_keys: dict[str, bytes] = {}
_fields: dict[tuple[bytes, str, Any, type], bytes] = {}
_names: dict[tuple[str, SpanKind], bytes] = {}
_internal_names: dict[str, bytes] = {}
_float_heads: dict[tuple[bytes, str], bytes] = {}  # a float attribute's bytes before its value
# Span flags (OTLP 1.x): "has is_remote" always, "is remote" when the parent came over the wire.
_FLAGS_LOCAL_PARENT = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE_PARENT = b"\x85\x01" + struct.pack("<I", 0x300)
_UNSET_LOCAL_PARENT = b"\x7a\x00" + _FLAGS_LOCAL_PARENT  # an empty status, then the flags


class UnsupportedSpan(ValueError):
    """A span this encoder does not cover (events, links, bytes or mapping attributes)."""


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= 0xFFFFFFFFFFFFFFFF  # int64 as two's complement, as protobuf does
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field; ``tag`` is the encoded (field number << 3) | 2."""
    size = len(payload)
    return tag + (_SMALL[size] if size < 0x80 else _varint(size)) + payload


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    raise UnsupportedSpan(f"attribute value of type {type(value).__name__}")


def _key(key: str) -> bytes:
    encoded = _keys.get(key)
    if encoded is None:
        if len(_keys) >= _CACHE_LIMIT:
            _keys.clear()
        encoded = _keys[key] = _field(b"\x0a", key.encode())
    return encoded


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a ``KeyValue`` field; strings, integers, booleans and tuples come whole
    from a cache (the type is part of its key: ``1 == True``)."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool or kind is tuple:
            field = _fields.get((tag, key, value, kind))
            if field is None:
                field = _field(tag, _key(key) + _field(b"\x12", _any_value(value)))
                if len(_fields) >= _CACHE_LIMIT:
                    _fields.clear()
                _fields[tag, key, value, kind] = field
        elif kind is float:  # durations: the value changes every time, its head does not
            head = _float_heads.get((tag, key))
            if head is None:
                key_field = _key(key)
                head = tag + _varint(len(key_field) + 11) + key_field + b"\x12\x09\x21"
                if len(_float_heads) >= _CACHE_LIMIT:
                    _float_heads.clear()
                _float_heads[tag, key] = head
            field = head + _DOUBLE.pack(value)
        else:
            field = _field(tag, _key(key) + _field(b"\x12", _any_value(value)))
        parts.append(field)
    return b"".join(parts)


def encode_span_fields(
    trace_id: int, span_id: int, parent_span_id: int | None, is_parent_remote: bool, name: str,
    kind: SpanKind, start_ns: int, end_ns: int, attributes: Mapping[str, Any] | None,
    status_code: StatusCode = StatusCode.UNSET, status_message: str | None = None,
    trace_state: TraceState | None = None,
) -> bytes:
    """One ``Span`` message."""
    if parent_span_id is not None and not trace_state:
        head = _IDS_WITH_PARENT.pack(b"\x0a\x10", trace_id >> 64, trace_id & _LOW64,
                                     b"\x12\x08", span_id, b"\x22\x08", parent_span_id)
    else:
        head = _IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & _LOW64, b"\x12\x08", span_id)
        if trace_state:
            head += _field(b"\x1a", ",".join(f"{k}={v}" for k, v in trace_state.items()).encode())
        if parent_span_id is not None:
            head += b"\x22\x08" + parent_span_id.to_bytes(8, "big")
    name_kind = _names.get((name, kind))
    if name_kind is None:
        if len(_names) >= _CACHE_LIMIT:
            _names.clear()
        name_kind = _names[name, kind] = (
            _field(b"\x2a", name.encode()) + b"\x30" + _SMALL[kind.value + 1])
    if status_code is StatusCode.UNSET and not status_message:
        status_field = b"\x7a\x00"
    else:
        body = _field(b"\x12", status_message.encode()) if status_message else b""
        if status_code.value:
            body += b"\x18" + _varint(status_code.value)
        status_field = _field(b"\x7a", body)
    return b"".join((
        head, name_kind, _TIMES.pack(0x39, start_ns, 0x41, end_ns),
        _attributes(b"\x4a", attributes), status_field,
        _FLAGS_REMOTE_PARENT if parent_span_id is not None and is_parent_remote
        else _FLAGS_LOCAL_PARENT))


def encode_children(
    trace_id: int, parent_span_id: int, trace_state: TraceState | None,
    children: Iterable[tuple[str, int, int, int, Mapping[str, Any] | None]],
) -> bytes:
    """INTERNAL spans under one local parent, status unset, framed for ``export_request``:
    a request's wait spans, ``(name, span_id, start_ns, end_ns, attributes)`` each. The same
    bytes as ``encode_span_fields`` gives, with the parts they share computed once."""
    if trace_state:
        return b"".join(framed_span(encode_span_fields(
            trace_id, span_id, parent_span_id, False, name, SpanKind.INTERNAL, start_ns, end_ns,
            attributes, trace_state=trace_state))
            for name, span_id, start_ns, end_ns, attributes in children)
    trace_part = _TRACE.pack(b"\x0a\x10", trace_id >> 64, trace_id & _LOW64, b"\x12\x08")
    parent_part = b"\x22\x08" + parent_span_id.to_bytes(8, "big")
    out = []
    for name, span_id, start_ns, end_ns, attributes in children:
        name_kind = _internal_names.get(name)
        if name_kind is None:
            if len(_internal_names) >= _CACHE_LIMIT:
                _internal_names.clear()
            name_kind = _internal_names[name] = (
                _field(b"\x2a", name.encode()) + b"\x30" + _SMALL[SpanKind.INTERNAL.value + 1])
        body = b"".join((trace_part, span_id.to_bytes(8, "big"), parent_part, name_kind,
                         _TIMES.pack(0x39, start_ns, 0x41, end_ns),
                         _attributes(b"\x4a", attributes), _UNSET_LOCAL_PARENT))
        out.append(_field(b"\x12", body))
    return b"".join(out)


# One request's spans as the gateway records them, encoded when its batch is sent: trace id,
# span id, parent span id, is the parent remote, trace state, name, start and end (ns),
# attributes and status of its SERVER span; then its waits' INTERNAL spans (see
# ``encode_children``).
RequestSpans = tuple[
    int, int, int | None, bool, TraceState | None, str, int, int, Mapping[str, Any], StatusCode,
    str | None, Sequence[tuple[str, int, int, int, Mapping[str, Any] | None]],
]


def encode_request_spans(spans: RequestSpans) -> bytes:
    """A request's spans, framed for ``export_request``: its waits', then its own."""
    (trace_id, span_id, parent_id, is_parent_remote, trace_state, name, start_ns, end_ns,
     attributes, status_code, status_message, children) = spans
    return encode_children(trace_id, span_id, trace_state, children) + framed_span(
        encode_span_fields(trace_id, span_id, parent_id, is_parent_remote, name, SpanKind.SERVER,
                           start_ns, end_ns, attributes, status_code, status_message,
                           trace_state))


def encode_span(span: ReadableSpan) -> bytes:
    """One ``Span`` message from an SDK span (events and links are not supported)."""
    if span.events or span.links:
        raise UnsupportedSpan("events and links")
    context, parent, status = span.context, span.parent, span.status
    assert context is not None
    return encode_span_fields(
        context.trace_id, context.span_id, parent.span_id if parent else None,
        bool(parent and parent.is_remote), span.name, span.kind, span.start_time or 0,
        span.end_time or 0, span.attributes, status.status_code, status.description,
        context.trace_state)


def framed_span(span: bytes) -> bytes:
    """A span as an entry of ``ScopeSpans.spans``: what ``export_request`` takes, concatenated."""
    return _field(b"\x12", span)


def export_request(resource: Resource, scope: InstrumentationScope | None,
                   framed_spans: bytes) -> bytes:
    """An ``ExportTraceServiceRequest`` with one resource and one scope."""
    return _resource_spans(resource, [(scope, framed_spans)])


def _resource_spans(resource: Resource,
                    scopes: Sequence[tuple[InstrumentationScope | None, bytes]]) -> bytes:
    body = _field(b"\x0a", _attributes(b"\x0a", resource.attributes))
    for scope, framed_spans in scopes:
        scope_body = b""
        if scope is not None:
            scope_body = _field(b"\x0a", scope.name.encode()) if scope.name else b""
            if scope.version:
                scope_body += _field(b"\x12", scope.version.encode())
            scope_body += _attributes(b"\x1a", scope.attributes)
        scope_spans = _field(b"\x0a", scope_body) + framed_spans
        if scope is not None and scope.schema_url:
            scope_spans += _field(b"\x1a", scope.schema_url.encode())
        body += _field(b"\x12", scope_spans)
    if resource.schema_url:
        body += _field(b"\x1a", resource.schema_url.encode())
    return _field(b"\x0a", body)


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` of SDK spans, grouped by resource, then by scope."""
    # Keyed by identity: hashing a Resource serializes its attributes, and every span of a
    # process shares one resource and one scope object.
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        by_scope = groups.setdefault(id(resource), (resource, {}))[1]
        by_scope.setdefault(id(scope), (scope, []))[1].append(framed_span(encode_span(span)))
    return b"".join(
        _resource_spans(resource, [(scope, b"".join(encoded))
                                   for scope, encoded in by_scope.values()])
        for resource, by_scope in groups.values())
