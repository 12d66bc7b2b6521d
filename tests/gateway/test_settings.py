"""load_settings and `switchyard config check`: every problem reported, each with its location."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import ConfigError, Settings, load_settings
from routing.aliases import Alias

GOOD = """\
listen:
  host: 0.0.0.0
  port: 9000
redis_url: redis://10.0.0.5:6379/1
admin_token: t0ken-9f2c41d87a3b5e60
backends:
  - name: a
    url: http://127.0.0.1:19001/
    models: [m1]
  - name: b
    url: https://engine-b:8000
    models: [m1, m2]
    weight: 2
default_tier: batch
"""

# Each error sits on its own line so the reported line numbers can be checked.
SEVERAL_ERRORS = """\
listen:
  port: 70000
backends:
  - name: a
    url: http://127.0.0.1:9000
    models: [m]
  - name: b
    url: ftp://nope
    models: []
upstream:
  connect_timeout_s: -1
log_level: loud
bogus: 1
"""

SEVERAL_ERRORS_EXPECTED = [
    (2, "listen.port"),
    (8, "backends[1].url"),
    (9, "backends[1].models"),
    (11, "upstream.connect_timeout_s"),
    (12, "log_level"),
    (13, "bogus"),
]

MINIMAL_BACKEND = "backends:\n  - {name: a, url: 'http://h:1', models: [m]}\n"


def write(tmp_path: Path, text: str, name: str = "switchyard.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_errors(
    path: Path | None, environ: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ or {})
    return info.value.errors


def test_good_file_loads(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, GOOD), {})
    assert settings.listen.host == "0.0.0.0"
    assert settings.listen.port == 9000
    assert settings.redis_url == "redis://10.0.0.5:6379/1"
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "t0ken-9f2c41d87a3b5e60"
    assert [b.name for b in settings.backends] == ["a", "b"]
    assert settings.backends[0].url == "http://127.0.0.1:19001"  # trailing slash dropped
    assert settings.backends[1].weight == 2
    assert settings.default_tier == "batch"


@pytest.mark.parametrize(
    ("text", "state"),
    [pytest.param("", "redis", id="default-redis"),
     pytest.param("state: memory\n", "memory", id="memory"),
     pytest.param("state: redis\n", "redis", id="redis")],
)
def test_state_is_redis_unless_memory_is_chosen(tmp_path: Path, text: str, state: str) -> None:
    assert load_settings(write(tmp_path, text), environ={}).state == state


def test_overrides_win_over_env_and_merge_one_level() -> None:
    env = {"SWITCHYARD_LISTEN__HOST": "0.0.0.0", "SWITCHYARD_LISTEN__PORT": "9000",
           "SWITCHYARD_STATE": "redis"}
    settings = load_settings(None, env, overrides={"listen": {"port": 9100}, "state": "memory"})
    assert (settings.listen.host, settings.listen.port, settings.state) == (
        "0.0.0.0", 9100, "memory")


def test_no_file_gives_defaults() -> None:
    settings = load_settings(None, {})
    assert settings == Settings()
    assert settings.listen.port == 8080
    assert settings.tier_names == ["interactive", "standard", "batch"]


def test_every_error_is_reported_with_file_line_and_path(tmp_path: Path) -> None:
    path = write(tmp_path, SEVERAL_ERRORS)
    errors = config_errors(path)
    locations = [location for location, _ in errors]
    assert len(errors) == len(SEVERAL_ERRORS_EXPECTED), errors
    for line, dotted in SEVERAL_ERRORS_EXPECTED:
        assert f"{path}:{line}: {dotted}" in locations, (dotted, locations)
    messages = dict(errors)
    assert "65535" in messages[f"{path}:2: listen.port"]
    assert "http://" in messages[f"{path}:8: backends[1].url"]
    assert "not permitted" in messages[f"{path}:13: bogus"].lower()


@pytest.mark.parametrize(
    ("text", "line", "dotted", "needle"),
    [
        pytest.param(
            "backends:\n  - {name: a, url: 'http://h:1', models: [m]}\n"
            "  - {name: a, url: 'http://h:2', models: [m]}\n",
            3, "backends[1].name", "'a'", id="duplicate-backend-name",
        ),
        pytest.param("default_tier: gold\n", 1, "default_tier", "gold", id="unknown-default-tier"),
        pytest.param(
            "tiers:\n  - {name: fast, priority: 0, ttft_slo_ms: 100}\n",
            None, "default_tier", "standard", id="default-tier-missing-from-custom-tiers",
        ),
        pytest.param("listen:\n  port: 80\n  hots: x\n", 3, "listen.hots", "not permitted",
                     id="unknown-nested-key"),
        pytest.param("colour: blue\n", 1, "colour", "not permitted", id="unknown-top-level-key"),
        pytest.param("backends:\n  - name: a\n    url: http://h:1\n", 2, "backends[0].models",
                     "required", id="missing-backend-field"),
        pytest.param("backends:\n  - name: 'bad name!'\n    url: http://h:1\n    models: [m]\n",
                     2, "backends[0].name", "letters", id="bad-backend-name"),
        pytest.param("listen: 5\n", 1, "listen", "dictionary", id="section-not-a-mapping"),
        pytest.param("state: disk\n", 1, "state", "'redis' or 'memory'", id="unknown-state"),
        pytest.param("routing:\n  share_push_ms: -1\n", 2, "routing.share_push_ms",
                     "greater than or equal to 0", id="negative-share-interval"),
        pytest.param("aliases:\n  - {name: chat, targets: [m1]}\n  - {name: chat, targets: [m2]}\n",
                     3, "aliases[1].name", "'chat' is repeated", id="duplicate-alias"),
        pytest.param("aliases:\n  - {name: a, targets: [m1]}\n"
                     "  - {name: b, targets: [m2], fallbacks: [a]}\n",
                     3, "aliases[1].name", "names the alias 'a'", id="alias-of-an-alias"),
        pytest.param("aliases:\n  - name: chat\n    targets:\n      - {model: m1, weight: 0}\n",
                     4, "aliases[0].targets[0].weight", "greater than 0", id="zero-weight"),
        pytest.param("aliases:\n  - {name: chat, fallbacks: ['bad model!']}\n",
                     2, "aliases[0].fallbacks", "not a model name", id="bad-fallback-name"),
    ],
)
def test_rejected_settings(
    tmp_path: Path, text: str, line: int | None, dotted: str, needle: str
) -> None:
    path = write(tmp_path, text)
    errors = config_errors(path)
    where = f"{path}:{line}: {dotted}" if line is not None else f"{path}: {dotted}"
    matching = [message for location, message in errors if location == where]
    assert matching, errors
    assert needle.lower() in matching[0].lower()


def test_aliases_load_with_names_as_targets_and_a_default_target(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, (
        "aliases:\n"
        "  - name: chat\n"
        "    targets: [m-v1, {model: m-v2, weight: 0.25}]\n"
        "    fallbacks: [m-small]\n"
        "  - {name: big, fallbacks: [m-small]}\n")), {})
    assert [alias.to_alias() for alias in settings.aliases] == [
        Alias("chat", (("m-v1", 1.0), ("m-v2", 0.25)), ("m-small",)),
        Alias("big", (("big", 1.0),), ("m-small",)),
    ]


def test_cross_field_errors_are_reported_with_field_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "backends:\n  - {name: a, url: 'http://h:1', models: [m]}\n"
        "  - {name: a, url: 'gopher://h', models: [m]}\ndefault_tier: gold\n",
    )
    locations = [location for location, _ in config_errors(path)]
    assert f"{path}:3: backends[1].url" in locations
    assert f"{path}:3: backends[1].name" in locations
    assert f"{path}:4: default_tier" in locations


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param("listen:\n  port: [1, 2\nfoo: bar\n", 3, id="unclosed-flow-list"),
        pytest.param("listen:\n  port: 1\n bad-indent: 2\n", 3, id="bad-indentation"),
        pytest.param("a: 'unterminated\n", 2, id="unterminated-quote"),
    ],
)
def test_invalid_yaml_reports_the_line(tmp_path: Path, text: str, line: int) -> None:
    path = write(tmp_path, text)
    errors = config_errors(path)
    assert len(errors) == 1
    location, message = errors[0]
    assert location == f"{path}:{line}"
    assert "not valid YAML" in message


@pytest.mark.parametrize(
    "text",
    [pytest.param("- a\n- b\n", id="list"), pytest.param("just a string\n", id="scalar")],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    [(location, message)] = config_errors(path)
    assert location == str(path)
    assert "mapping" in message


def test_missing_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    [(location, message)] = config_errors(path)
    assert location == str(path)
    assert "cannot read" in message


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, ""), {}) == Settings()


def test_env_overrides_file_values(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    environ = {
        "SWITCHYARD_LISTEN__PORT": "9100",
        "SWITCHYARD_REDIS_URL": "redis://10.9.9.9:6380/2",
        "SWITCHYARD_BACKENDS": '[{name: x, url: "http://h:8000", models: [m, n]}, '
                               '{name: y, url: "http://g:8001", models: [n], weight: 0.5}]',
        "SWITCHYARD_ADMIN_TOKEN": "123",  # a secret stays a string, never a YAML int
        "SWITCHYARD_UPSTREAM__RETRY_BEFORE_FIRST_BYTE": "false",
        "SWITCHYARD_CONFIG": "ignored.yaml",
        "OTHER_VARIABLE": "ignored",
    }
    settings = load_settings(path, environ)
    assert settings.listen.port == 9100
    assert settings.listen.host == "0.0.0.0"  # the rest of the section is kept
    assert settings.redis_url == "redis://10.9.9.9:6380/2"
    assert [(b.name, b.url, b.models, b.weight) for b in settings.backends] == [
        ("x", "http://h:8000", ["m", "n"], 1.0),
        ("y", "http://g:8001", ["n"], 0.5),
    ]
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "123"
    assert settings.upstream.retry_before_first_byte is False


def test_env_alone_without_a_file() -> None:
    environ = {"SWITCHYARD_LISTEN__PORT": "0", "SWITCHYARD_LOG_LEVEL": "debug"}
    settings = load_settings(None, environ)
    assert settings.listen.port == 0
    assert settings.log_level == "debug"


def test_the_variables_of_setup_and_the_native_build_are_not_settings() -> None:
    """``SWITCHYARD_WORKER=1 ./scripts/up.sh`` and ``SWITCHYARD_NATIVE=0`` reach the gateway's
    environment; they are not settings (and not unknown ones)."""
    environ = {"SWITCHYARD_WORKER": "1", "SWITCHYARD_NATIVE": "0", "SWITCHYARD_LOG_LEVEL": "debug"}
    assert load_settings(None, environ).log_level == "debug"


@pytest.mark.parametrize(
    ("environ", "expected_location"),
    [
        pytest.param({"SWITCHYARD_LISTEN__PORT": "abc"},
                     "listen.port (from $SWITCHYARD_LISTEN__PORT)", id="port-not-int"),
        pytest.param({"SWITCHYARD_LISTEN__PORT": "99999"},
                     "listen.port (from $SWITCHYARD_LISTEN__PORT)", id="port-out-of-range"),
        pytest.param({"SWITCHYARD_BACKENDS": '[{name: a, url: "ftp://h", models: [m]}]'},
                     "backends[0].url (from $SWITCHYARD_BACKENDS)", id="backend-url"),
        pytest.param({"SWITCHYARD_BACKENDS": "[{name: a, url: 'http://h:1'}]"},
                     "backends[0].models (from $SWITCHYARD_BACKENDS)", id="backend-missing-field"),
        pytest.param({"SWITCHYARD_BACKENDS": "not a list"},
                     "backends (from $SWITCHYARD_BACKENDS)", id="backends-not-a-list"),
        pytest.param({"SWITCHYARD_BOGUS": "1"}, "bogus (from $SWITCHYARD_BOGUS)",
                     id="unknown-variable"),
        pytest.param({"SWITCHYARD_UPSTREAM__NOPE": "1"},
                     "upstream.nope (from $SWITCHYARD_UPSTREAM__NOPE)", id="unknown-nested"),
    ],
)
def test_env_errors_name_the_variable(
    tmp_path: Path, environ: dict[str, str], expected_location: str
) -> None:
    errors = config_errors(write(tmp_path, MINIMAL_BACKEND), environ)
    assert expected_location in [location for location, _ in errors], errors


def test_env_and_file_errors_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path, "log_level: loud\n")
    errors = config_errors(path, {"SWITCHYARD_LISTEN__PORT": "abc"})
    locations = [location for location, _ in errors]
    assert f"{path}:1: log_level" in locations
    assert "listen.port (from $SWITCHYARD_LISTEN__PORT)" in locations


# -- the CLI --------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, env=env,
        timeout=30, check=False,
    )


def test_config_check_accepts_a_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run_cli("config", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert f"{path}: OK" in result.stdout
    assert "2 backends" in result.stdout
    assert "0.0.0.0:9000" in result.stdout


def test_config_check_lists_every_error_and_exits_1(tmp_path: Path) -> None:
    path = write(tmp_path, SEVERAL_ERRORS)
    result = run_cli("config", "check", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"{path}: {len(SEVERAL_ERRORS_EXPECTED)} errors" in result.stderr
    for line, dotted in SEVERAL_ERRORS_EXPECTED:
        assert f"{path}:{line}: {dotted}: " in result.stderr, (dotted, result.stderr)


def test_config_check_reports_invalid_yaml_line(tmp_path: Path) -> None:
    path = write(tmp_path, "listen:\n  port: [1, 2\nfoo: bar\n")
    result = run_cli("config", "check", str(path))
    assert result.returncode == 1
    assert f"{path}:3: not valid YAML" in result.stderr


@pytest.mark.parametrize("token", ["''", "'   '"])
def test_an_empty_admin_token_is_refused(tmp_path: Path, token: str) -> None:
    """An empty token would match an empty bearer: refused, with what to do instead."""
    errors = config_errors(write(tmp_path, f"admin_token: {token}\n" + MINIMAL_BACKEND))
    assert len(errors) == 1 and errors[0][0].endswith(":1: admin_token"), errors
    assert "leave admin_token unset" in errors[0][1]
    blank_env = config_errors(None, {"SWITCHYARD_ADMIN_TOKEN": " "})
    assert blank_env[0][0] == "admin_token (from $SWITCHYARD_ADMIN_TOKEN)", blank_env


@pytest.mark.parametrize(("secrets", "expected"), [
    pytest.param("admin_token: change-me-admin-token\n", [(1, "admin_token", "placeholder")],
                 id="placeholder-token"),
    pytest.param("admin_token: short\nkey_secret: also-too-short\n",
                 [(1, "admin_token", "is 5 characters"), (2, "key_secret", "is 14 characters")],
                 id="short"),
    pytest.param("admin_token: 3f9a0c1e5b7d2a4c6e8f\n"
                 "key_secret: 0123456789abcdef0123456789abcdef\n", [], id="strong"),
])
def test_config_check_refuses_weak_secrets_outside_dev(
        tmp_path: Path, secrets: str, expected: list[tuple[int, str, str]]) -> None:
    path = write(tmp_path, secrets + MINIMAL_BACKEND)
    result = run_cli("config", "check", str(path))
    assert result.returncode == (1 if expected else 0), result.stderr
    for line, name, words in expected:
        [message] = [m for m in result.stderr.splitlines() if f"{path}:{line}: {name}: " in m]
        assert words in message and "--dev" in message
    assert run_cli("config", "check", "--dev", str(path)).returncode == 0
    # The server itself takes what it is given (a development fleet runs on placeholders).
    assert load_settings(path).admin_token is not None
