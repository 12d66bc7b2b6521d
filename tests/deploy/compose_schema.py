"""A JSON Schema (Draft 2020-12) for deploy/docker-compose.yml.

This is our own subset of the Compose Specification's fields (https://compose-spec.io), written
for this project's file: the top-level sections, and for a service every key the file uses plus
the common ones an edit is likely to add. Unknown keys are refused (a typo fails) except the
``x-`` extensions the specification reserves. Where a value may also be a ``${VAR}``
substitution in the file as written, the patterns accept one; tests/deploy/test_compose.py
validates the file both as written and with the variables filled in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMPOSE_SCHEMA"]

_EXTENSIONS = {"^x-": {}}
# Go duration syntax, the units the specification lists: 1m30s, 2s, 500ms.
_DURATION_PATTERN = r"(\d+(\.\d+)?(us|ms|s|m|h))+"
_RESTART_PATTERN = r"no|always|on-failure(:\d+)?|unless-stopped"


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with exactly ``properties`` (and ``x-`` extensions)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "patternProperties": _EXTENSIONS, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def _matching(pattern: str) -> dict[str, Any]:
    """A string matching ``pattern`` in full, or one holding a ``${VAR}`` substitution."""
    return {"type": "string", "pattern": rf"^(?:{pattern})$|\$\{{"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _map_of(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": value}


_STRING: dict[str, Any] = {"type": "string"}
_BOOLEAN: dict[str, Any] = {"type": "boolean"}
_INTEGER: dict[str, Any] = {"type": "integer"}
_SCALAR: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}

_DEFS: dict[str, Any] = {
    "duration": _matching(_DURATION_PATTERN),
    "strings": {"type": "array", "items": _STRING, "uniqueItems": True},
    "string_or_list": {"oneOf": [_STRING, _ref("strings")]},
    # `command: ["serve"]` or `command: serve --config x`; null resets the image's default.
    "command": {"oneOf": [{"type": "null"}, _STRING, {"type": "array", "items": _STRING}]},
    # environment, labels, build args: `KEY=value` strings or a KEY: value mapping.
    "list_or_map": {"oneOf": [_ref("strings"), _map_of(_SCALAR)]},
    "build": {"oneOf": [_STRING, _strict({
        "context": _STRING, "dockerfile": _STRING, "dockerfile_inline": _STRING,
        "args": _ref("list_or_map"), "target": _STRING, "labels": _ref("list_or_map"),
        "cache_from": _ref("strings"), "cache_to": _ref("strings"), "network": _STRING,
        "platforms": _ref("strings"), "tags": _ref("strings"), "pull": _BOOLEAN,
        "no_cache": _BOOLEAN, "shm_size": {"type": ["string", "integer"]},
        "secrets": {"type": "array", "items": _ref("file_reference")},
        "ssh": _ref("list_or_map"), "additional_contexts": _ref("list_or_map"),
        "extra_hosts": _ref("extra_hosts"),
    })]},
    "env_file": {"oneOf": [_STRING, {"type": "array", "items": {"oneOf": [_STRING, _strict(
        {"path": _STRING, "required": _BOOLEAN, "format": _STRING}, required=("path",))]}}]},
    "port": {"oneOf": [{"type": "number"}, _STRING, _strict({
        "name": _STRING, "mode": {"enum": ["host", "ingress"]}, "host_ip": _STRING,
        "target": {"type": ["integer", "string"]}, "published": {"type": ["integer", "string"]},
        "protocol": {"enum": ["tcp", "udp"]}, "app_protocol": _STRING,
    }, required=("target",))]},
    "volume_mount": {"oneOf": [_STRING, _strict({
        "type": {"enum": ["bind", "volume", "tmpfs", "image", "npipe", "cluster"]},
        "source": _STRING, "target": _STRING, "read_only": _BOOLEAN, "consistency": _STRING,
        "bind": _strict({"propagation": _STRING, "create_host_path": _BOOLEAN,
                         "selinux": {"enum": ["z", "Z"]}}),
        "volume": _strict({"nocopy": _BOOLEAN, "subpath": _STRING}),
        "tmpfs": _strict({"size": {"type": ["integer", "string"]}, "mode": _INTEGER}),
        "image": _strict({"subpath": _STRING}),
    }, required=("type", "target"))]},
    "depends_on": {"oneOf": [_ref("strings"), _map_of(_strict({
        "condition": {"enum": ["service_started", "service_healthy",
                               "service_completed_successfully"]},
        "restart": _BOOLEAN, "required": _BOOLEAN,
    }, required=("condition",)))]},
    "healthcheck": _strict({
        "test": {"oneOf": [_STRING, {"type": "array", "items": _STRING, "minItems": 1}]},
        "interval": _ref("duration"), "timeout": _ref("duration"),
        "start_period": _ref("duration"), "start_interval": _ref("duration"),
        "retries": _INTEGER, "disable": _BOOLEAN,
    }),
    "resources": _strict({
        "cpus": {"type": ["number", "string"]}, "memory": _STRING, "pids": _INTEGER,
        "devices": {"type": "array", "items": _strict({
            "driver": _STRING, "count": {"oneOf": [_INTEGER, {"const": "all"}]},
            "device_ids": _ref("strings"), "capabilities": _ref("strings"),
            "options": _ref("list_or_map"),
        })},
    }),
    "deploy": _strict({
        "mode": {"enum": ["replicated", "global", "replicated-job", "global-job"]},
        "replicas": _INTEGER, "endpoint_mode": {"enum": ["vip", "dnsrr"]},
        "labels": _ref("list_or_map"),
        "resources": _strict({"limits": _ref("resources"), "reservations": _ref("resources")}),
        "restart_policy": _strict({
            "condition": {"enum": ["none", "on-failure", "any"]}, "delay": _ref("duration"),
            "max_attempts": _INTEGER, "window": _ref("duration"),
        }),
        "placement": _strict({"constraints": _ref("strings"), "preferences": {"type": "array"},
                              "max_replicas_per_node": _INTEGER}),
    }),
    "service_networks": {"oneOf": [_ref("strings"), _map_of({"oneOf": [{"type": "null"}, _strict({
        "aliases": _ref("strings"), "ipv4_address": _STRING, "ipv6_address": _STRING,
        "priority": _INTEGER, "mac_address": _STRING,
    })]})]},
    "ulimits": _map_of({"oneOf": [_INTEGER, _strict(
        {"soft": _INTEGER, "hard": _INTEGER}, required=("soft", "hard"))]}),
    "extra_hosts": {"oneOf": [_ref("strings"), _map_of({"oneOf": [_STRING, _ref("strings")]})]},
    "logging": _strict({"driver": _STRING, "options": _map_of(_SCALAR)}),
    # A service's `configs:` / `secrets:` entry: the top-level name, or where to put it.
    "file_reference": {"oneOf": [_STRING, _strict({
        "source": _STRING, "target": _STRING, "uid": _STRING, "gid": _STRING,
        "mode": {"type": ["integer", "string"]},
    }, required=("source",))]},
}

_SERVICE = _strict({
    "image": _STRING, "build": _ref("build"),
    "command": _ref("command"), "entrypoint": _ref("command"),
    "environment": _ref("list_or_map"), "env_file": _ref("env_file"),
    "ports": {"type": "array", "items": _ref("port")},
    "expose": {"type": "array", "items": {"type": ["string", "integer"]}, "uniqueItems": True},
    "volumes": {"type": "array", "items": _ref("volume_mount")},
    "tmpfs": _ref("string_or_list"),
    "depends_on": _ref("depends_on"),
    "healthcheck": _ref("healthcheck"),
    "restart": _matching(_RESTART_PATTERN),
    "deploy": _ref("deploy"),
    "profiles": _ref("strings"),
    "networks": _ref("service_networks"), "network_mode": _STRING,
    "configs": {"type": "array", "items": _ref("file_reference")},
    "secrets": {"type": "array", "items": _ref("file_reference")},
    "user": _STRING, "working_dir": _STRING,
    "stop_grace_period": _ref("duration"), "stop_signal": _STRING,
    "ulimits": _ref("ulimits"), "labels": _ref("list_or_map"),
    "init": _BOOLEAN, "read_only": _BOOLEAN, "privileged": _BOOLEAN,
    "cap_add": _ref("strings"), "cap_drop": _ref("strings"), "security_opt": _ref("strings"),
    "extra_hosts": _ref("extra_hosts"), "logging": _ref("logging"),
    "container_name": _STRING, "hostname": _STRING, "platform": _STRING,
    "pull_policy": {"enum": ["always", "never", "missing", "build", "if_not_present"]},
    "shm_size": {"type": ["string", "integer"]}, "devices": {"type": "array"},
    "tty": _BOOLEAN, "stdin_open": _BOOLEAN,
})


def _section(entry: dict[str, Any]) -> dict[str, Any]:
    """A top-level section: resource names mapped to ``entry``."""
    return {"type": "object", "patternProperties": {"^[a-zA-Z0-9._-]+$": entry},
            "additionalProperties": False}


_DRIVER_FIELDS = {"name": _STRING, "driver": _STRING, "driver_opts": _map_of(_SCALAR),
                  "external": _BOOLEAN, "labels": _ref("list_or_map")}
_VOLUME = {"oneOf": [{"type": "null"}, _strict(_DRIVER_FIELDS)]}
_NETWORK = {"oneOf": [{"type": "null"}, _strict({
    **_DRIVER_FIELDS, "internal": _BOOLEAN, "attachable": _BOOLEAN,
    "enable_ipv6": _BOOLEAN, "ipam": {"type": "object"},
})]}
_FILE_SOURCE = {"name": _STRING, "file": _STRING, "environment": _STRING,
                "external": _BOOLEAN, "labels": _ref("list_or_map")}

COMPOSE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": _DEFS,
    **_strict({
        "name": _STRING,
        "services": _section(_SERVICE),
        "volumes": _section(_VOLUME),
        "networks": _section(_NETWORK),
        "configs": _section(_strict({**_FILE_SOURCE, "content": _STRING,
                                     "template_driver": _STRING})),
        "secrets": _section(_strict({**_FILE_SOURCE, "driver": _STRING,
                                     "driver_opts": _map_of(_SCALAR)})),
    }),
}
