"""`switchyard up` brings up Redis, simulated engines, a PyTorch worker and the gateway, prints a
working demo key, and Ctrl-C (SIGINT) stops every child."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from gateway.cli.localproc import free_port


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


def test_up_serves_the_demo_key_and_ctrl_c_stops_every_child() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "up", "--port", str(port), "--workers", "2",
         "--pytorch-workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
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
