"""`switchyard serve --backend URL ...` end to end: real engines, a real gateway process, no file.

Without --redis-url the gateway keeps its state in memory and must never try Redis: its log is
checked for any Redis traffic, and its sockets for a connection to a Redis port, so the tests
hold whether or not a Redis runs on 127.0.0.1:6379.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.cli.localproc import ProcessGroup, free_port, python_module_argv, wait_http
from gateway.state import MEMORY_WARNING
from tests.fleet import Engine

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")
_TOKEN_RE = re.compile(r"^  admin token: (\S+)   \(shown only here\)$", re.MULTILINE)
_LOG_LINE_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
# A fresh Debian shell: no virtual environment or pyenv on PATH, so no `python` or `switchyard`.
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The banner's commands as printed (a command's lines after its first are not indented).
PRINTED_COMMANDS = {
    "keys": re.compile(r"^    (SWITCHYARD_URL=.* keys create --tenant default)$", re.MULTILINE),
    "curl": re.compile(r"^    (curl .*\\\n.*)$", re.MULTILINE),
    "python": re.compile(r"^    (\S+ -c '.*?')$", re.MULTILINE | re.DOTALL),
}


class QuickGateway:
    """A `switchyard serve --backend ...` process; stdout and stderr go to one log file."""

    def __init__(self, group: ProcessGroup, log_dir: Path, backends: list[str],
                 *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = f"quickstart-{self.port}"
        self.log_path = log_dir / f"{self.name}.log"
        argv = python_module_argv("gateway", "serve", "--port", str(self.port), *extra)
        for url in backends:
            argv += ["--backend", url]
        self.process = group.spawn(self.name, argv, env=env)
        deadline = time.monotonic() + 60
        while (match := _TOKEN_RE.search(self.output())) is None:
            assert self.process.poll() is None, f"gateway exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"no banner:\n{self.output()}"
            time.sleep(0.05)
        self.admin_token = match.group(1)
        wait_http(self.url + "/readyz", group=group)
        self.admin = httpx.Client(base_url=self.url, timeout=10,
                                  headers={"Authorization": f"Bearer {self.admin_token}"})

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def new_key(self, tenant_id: str = "default") -> dict[str, Any]:
        response = self.admin.post("/admin/keys", json={"tenant_id": tenant_id})
        assert response.status_code == 201, response.text
        return dict(response.json())


def tcp_connections_to(pid: int, port: int) -> list[str]:
    """This process's TCP sockets whose remote end is ``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and fields[2].endswith(f":{port:04X}"):
                found.append(line)
    return found


@pytest.fixture(scope="module")
def quick_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcessGroup, Path]]:
    log_dir = tmp_path_factory.mktemp("quickstart")
    group = ProcessGroup(log_dir=log_dir)
    try:
        yield group, log_dir
    finally:
        group.stop_all(grace_s=5)


@pytest.fixture(scope="module")
def quick_engines(quick_procs: tuple[ProcessGroup, Path]) -> list[Engine]:
    group, _ = quick_procs
    return [Engine(group, "qs-engine-a", models=("qs-model-a",)),
            Engine(group, "qs-engine-b", models=("qs-model-b", "qs-shared"))]


@pytest.fixture(scope="module")
def quick(quick_procs: tuple[ProcessGroup, Path], quick_engines: list[Engine]) -> QuickGateway:
    group, log_dir = quick_procs
    return QuickGateway(group, log_dir, [e.url for e in quick_engines])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(gw: QuickGateway, key: str, model: str = "qs-model-a") -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", headers=bearer(key), timeout=10,
                      json={"model": model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]})


def test_banner_names_backends_models_token_tenant_and_commands(
    quick: QuickGateway, quick_engines: list[Engine]
) -> None:
    out = quick.output()
    assert f"switchyard gateway listening on {quick.url}" in out
    a, b = quick_engines
    assert re.search(rf"127\.0\.0\.1:{a.port}\s+{a.url}\s+models: qs-model-a$", out, re.M)
    assert re.search(rf"127\.0\.0\.1:{b.port}\s+{b.url}\s+models: qs-model-b, qs-shared$",
                     out, re.M)
    assert f"WARNING: {MEMORY_WARNING}" in out
    assert "tenant: default (created: every model, tier standard)" in out
    assert (f"SWITCHYARD_URL={quick.url} SWITCHYARD_ADMIN_TOKEN={quick.admin_token} "
            f"{SWITCHYARD} keys create --tenant default") in out
    assert f"curl {quick.url}/v1/chat/completions" in out
    assert f'OpenAI(base_url="{quick.url}/v1"' in out
    assert out.count(quick.admin_token) == 2  # the token line and the command, in the banner
    log_lines = [line for line in out.splitlines() if _LOG_LINE_RE.match(line)]
    assert log_lines and not [line for line in log_lines if quick.admin_token in line]


def run_printed(gw: QuickGateway, kind: str, cwd: Path, **env: str) -> str:
    """Run the banner's ``kind`` command in a fresh shell; its standard output."""
    match = PRINTED_COMMANDS[kind].search(gw.output())
    assert match, f"no {kind} command in the banner:\n{gw.output()}"
    result = subprocess.run(["/bin/sh", "-c", match.group(1)], capture_output=True, text=True,
                            timeout=30, check=False, cwd=cwd,
                            env={"PATH": FRESH_PATH, "HOME": str(cwd), **env})
    assert result.returncode == 0, f"{match.group(1)}\n{result.stderr}"
    return result.stdout


def test_the_printed_cli_command_makes_a_working_key(quick: QuickGateway, tmp_path: Path) -> None:
    key = json.loads(run_printed(quick, "keys", tmp_path))["key"]
    assert chat(quick, key).status_code == 200


@pytest.mark.parametrize("kind", ["curl", "python"])
def test_the_printed_calls_work_with_the_printed_key(quick: QuickGateway, kind: str,
                                                     tmp_path: Path) -> None:
    if kind == "curl" and shutil.which("curl", path=FRESH_PATH) is None:
        pytest.skip("curl is not installed: the printed curl command cannot run here")
    key = json.loads(run_printed(quick, "keys", tmp_path))["key"]
    output = run_printed(quick, kind, tmp_path, KEY=key)
    if kind == "curl":
        assert json.loads(output)["choices"][0]["message"]["content"], output
    else:
        assert output.strip()


def test_models_chat_and_streaming_through_the_openai_sdk(quick: QuickGateway) -> None:
    client = openai.OpenAI(base_url=quick.url + "/v1", api_key=quick.new_key()["key"],
                           max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["qs-model-a", "qs-model-b",
                                                          "qs-shared"]
    for model in ("qs-model-a", "qs-model-b"):
        completion = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=3)
        assert completion.model == model and completion.choices[0].message.content
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=3,
            stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and chunks[-1].usage is not None


def test_tenant_limit_is_enforced_with_429_and_retry_after(quick: QuickGateway) -> None:
    response = quick.admin.post("/admin/tenants", json={
        "id": "limited", "name": "limited", "limits": {"requests_per_minute": 2}})
    assert response.status_code == 201, response.text
    key = quick.new_key("limited")["key"]
    assert [chat(quick, key).status_code for _ in range(2)] == [200, 200]
    refused = chat(quick, key)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 25 <= int(refused.headers["retry-after"]) <= 31  # one request per 30 s comes back


def test_revocation_takes_effect_on_the_next_request(quick: QuickGateway) -> None:
    record = quick.new_key()
    assert chat(quick, record["key"]).status_code == 200  # cached now
    assert quick.admin.delete(f"/admin/keys/{record['id']}").status_code == 200
    refused = chat(quick, record["key"])
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "revoked_api_key"


def test_fleet_lists_both_backends_from_config_and_readyz_is_200(
    quick: QuickGateway, quick_engines: list[Engine]
) -> None:
    fleet = quick.admin.get("/admin/fleet").json()["data"]
    assert {(b["name"], b["url"], b["source"]) for b in fleet} == {
        (f"127.0.0.1:{e.port}", e.url, "config") for e in quick_engines}
    assert all(b["is_healthy"] for b in fleet)
    ready = httpx.get(quick.url + "/readyz", timeout=5)
    assert ready.status_code == 200
    assert len(ready.json()["healthy_backends"]) == 2


def test_memory_mode_never_tries_redis(quick: QuickGateway) -> None:
    assert chat(quick, quick.new_key()["key"]).status_code == 200
    assert tcp_connections_to(quick.process.pid, 6379) == []
    mentions = [line for line in quick.output().splitlines()
                if "redis" in line.lower() and MEMORY_WARNING not in line]
    assert mentions == []


@pytest.mark.parametrize(
    ("backend", "extra", "status", "message"),
    [
        pytest.param("http://127.0.0.1:{free}", ("--wait-s", "2"), 1,
                     r"the engine at http://127\.0\.0\.1:\d+ did not answer GET .*/v1/models "
                     r"within 2 s \(connection refused\)\. Check that the engine is running",
                     id="unreachable"),
        pytest.param("{engine}/v1", (), 1, r"HTTP 404\. Drop the trailing /v1", id="v1-suffix"),
        pytest.param("ftp://nope", (), 2, r"--backend 'ftp://nope': must be an http", id="bad-url"),
        pytest.param("{engine}", ("--admin-token", " "), 2, r"--admin-token may not be empty",
                     id="empty-admin-token"),
        pytest.param("{engine}", ("--config", "x.yaml"), 2,
                     r"--backend, --port cannot be combined with --config", id="with-config"),
    ],
)
def test_an_unusable_backend_exits_non_zero_with_a_clear_message(
    quick_engines: list[Engine], backend: str, extra: tuple[str, ...], status: int,
    message: str,
) -> None:
    url = backend.format(free=free_port(), engine=quick_engines[0].url)
    started = time.monotonic()
    result = subprocess.run(
        python_module_argv("gateway", "serve", "--backend", url, "--port", str(free_port()),
                           *extra), capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == status, result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert time.monotonic() - started < 15


def test_redis_url_mode_shares_tenants_and_keys_between_replicas(
    quick_procs: tuple[ProcessGroup, Path], quick_engines: list[Engine], redis_url: str,
) -> None:
    group, log_dir = quick_procs
    shared_url = redis_url.rsplit("/", 1)[0] + "/12"
    redis.Redis.from_url(shared_url).flushdb()
    env = {"SWITCHYARD_KEY_SECRET": "quickstart-test-secret-0123456789"}
    backends = [e.url for e in quick_engines]
    first = QuickGateway(group, log_dir, backends, "--redis-url", shared_url, env=env)
    second = QuickGateway(group, log_dir, backends, "--redis-url", shared_url, env=env)
    assert "state: in Redis" in first.output() and MEMORY_WARNING not in first.output()
    assert "tenant: default (created" in first.output()
    assert "tenant: default (already stored: kept as it is)" in second.output()
    record = first.new_key()
    assert chat(second, record["key"], "qs-model-b").status_code == 200
    port = int(shared_url.rsplit(":", 1)[1].split("/")[0])
    assert tcp_connections_to(second.process.pid, port)  # what the memory test looks for
    assert redis.Redis.from_url(shared_url).exists("sy:tenant:{default}")
    assert second.admin.delete(f"/admin/keys/{record['id']}").status_code == 200
    deadline = time.monotonic() + 2
    while chat(first, record["key"]).status_code != 401:
        assert time.monotonic() < deadline, "revocation on one replica not seen by the other"
        time.sleep(0.02)
