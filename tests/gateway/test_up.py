"""`switchyard up` brings up Redis, simulated engines, a PyTorch worker and the gateway, prints a
working demo key and commands that work as printed, and Ctrl-C (SIGINT) stops every child."""

from __future__ import annotations

import asyncio
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from gateway.cli.localproc import free_port

# A fresh Debian shell: no virtual environment or pyenv on PATH, so no `python` either.
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The banner's commands, each up to the blank line after it.
PRINTED_COMMANDS = {
    "curl": re.compile(r"^  (curl .*?)\n\n", re.MULTILINE | re.DOTALL),
    "python": re.compile(r"^  (\S+ -c '.*?')\n\n", re.MULTILINE | re.DOTALL),
}


def _children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.add(int(entry.name))
    return found


def _is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _read_until(proc: subprocess.Popen[bytes], pattern: str, timeout_s: float) -> str:
    # Raw reads from the pipe: a buffered readline can swallow lines that select() then
    # never reports again.
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    output = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not re.search(pattern, output.decode(errors="replace")):
        if selector.select(timeout=0.2):
            data = os.read(fd, 65536)
            if not data:
                break
            output += data
    return output.decode(errors="replace")


def _start_up(port: int, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "up", "--port", str(port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def sim_banner() -> Iterator[str]:
    """The banner of `switchyard up` with one simulated worker (the README's local fleet)."""
    proc = _start_up(free_port(), "--workers", "1")
    try:
        output = _read_until(proc, r"Ctrl-C stops everything", 60)
        assert "Ctrl-C stops everything" in output, output
        yield output
    finally:
        _stop(proc)


@pytest.mark.parametrize("kind", sorted(PRINTED_COMMANDS))
def test_each_printed_command_works_as_printed(sim_banner: str, kind: str,
                                               tmp_path: Path) -> None:
    match = PRINTED_COMMANDS[kind].search(sim_banner)
    assert match, f"no {kind} command in:\n{sim_banner}"
    if kind == "curl" and shutil.which("curl", path=FRESH_PATH) is None:
        pytest.skip("curl is not installed: the printed curl command cannot run here")
    result = subprocess.run(["/bin/sh", "-c", match.group(1)], capture_output=True, text=True,
                            timeout=60, check=False, cwd=tmp_path,
                            env={"PATH": FRESH_PATH, "HOME": str(tmp_path)})
    assert result.returncode == 0, f"{match.group(1)}\n{result.stderr}"
    if kind == "curl":
        assert json.loads(result.stdout)["choices"][0]["message"]["content"], result.stdout
    else:
        assert result.stdout.strip(), result.stderr


def test_up_serves_the_demo_key_and_ctrl_c_stops_every_child() -> None:
    port = free_port()
    proc = _start_up(port, "--workers", "2", "--pytorch-workers", "1")
    try:
        output = _read_until(proc, r"PyTorch worker\(s\) serve", 180)
        match = re.search(r"demo key: (sy-[0-9a-f]{16}-[A-Za-z0-9_-]{43})", output)
        assert match, output
        assert f"curl http://127.0.0.1:{port}/v1/chat/completions" in output
        children = _children_of(proc.pid)
        assert len(children) >= 4, children  # redis, the simulated fleet, a worker, the gateway

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=match.group(1),
                               max_retries=0)
        reply = client.chat.completions.create(
            model="switchyard-sim", messages=[{"role": "user", "content": "hello there"}],
            max_tokens=3,
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 3
        # The bundled PyTorch worker joined through its heartbeat and answers with the real model.
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=3, temperature=0,
        )
        assert reply.model == "SmolLM2-135M-Instruct" and reply.choices[0].message.content
        # Embeddings from both kinds of worker, found through their heartbeats.
        simulated = client.embeddings.create(model="switchyard-sim", input="hello there")
        assert len(simulated.data[0].embedding) == 64
        pooled = client.embeddings.create(model="SmolLM2-135M-Instruct",
                                          input=["Trains are fast.", "Trains are quick."])
        first, second = (d.embedding for d in pooled.data)
        assert len(first) == 576  # SmolLM2-135M's hidden size
        assert sum(a * b for a, b in zip(first, second, strict=True)) > 0.5  # alike sentences
        # Anthropic Messages and OpenAI Responses from both kinds of worker (own-fleet mode:
        # found through their heartbeats), with the demo key in Anthropic's x-api-key.
        messages = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                       api_key=match.group(1), max_retries=0)
        for model in ("switchyard-sim", "SmolLM2-135M-Instruct"):
            message = messages.messages.create(
                model=model, max_tokens=3, messages=[{"role": "user", "content": "Say hi."}])
            assert message.content[0].text and message.usage.output_tokens  # type: ignore
            with messages.messages.stream(model=model, max_tokens=3, messages=[
                    {"role": "user", "content": "Say hi."}]) as stream:
                assert "".join(stream.text_stream)
            response = client.responses.create(model=model, input="Say hi.",
                                               max_output_tokens=3)
            assert response.output_text and response.usage is not None

        async def message_async() -> str:
            async with anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}",
                                                api_key=match.group(1), max_retries=0) as aio:
                reply = await aio.messages.create(model="switchyard-sim", max_tokens=2,
                                                  messages=[{"role": "user", "content": "Hi"}])
            return reply.content[0].text  # type: ignore[union-attr]

        assert asyncio.run(message_async())

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_is_running(c) for c in children):
            time.sleep(0.05)
        assert not [c for c in children if _is_running(c)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_on_a_private_redis_cluster() -> None:
    """`switchyard up --redis-cluster`: three cluster nodes, the worker joins through them and
    the demo key answers; Ctrl-C stops every node."""
    port = free_port()
    proc = _start_up(port, "--workers", "1", "--tokenizer", "approx", "--redis-cluster")
    try:
        output = _read_until(proc, r"Ctrl-C stops everything", 90)
        match = re.search(r"demo key: (sy-[0-9a-f]{16}-[A-Za-z0-9_-]{43})", output)
        assert match, output
        children = _children_of(proc.pid)
        nodes = [c for c in children if "[cluster]" in _cmdline(c)]  # redis-server's title
        assert len(nodes) == 3, [_cmdline(c)[:80] for c in children]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=match.group(1),
                               max_retries=0)
        reply = client.chat.completions.create(
            model="switchyard-sim", messages=[{"role": "user", "content": "hello there"}],
            max_tokens=3)
        assert reply.usage is not None and reply.usage.completion_tokens == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_is_running(c) for c in nodes):
            time.sleep(0.05)
        assert not [c for c in nodes if _is_running(c)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
