"""`switchyard worker`'s command line: the deploy commands parse, flags become the engine's
settings, and mistakes stop it with a message that says what to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backends.worker.cli import build_parser, config_from_args, resolve_model
from gateway.cli.commands import main as switchyard_main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("argv", [
    pytest.param(["--model", "smollm2", "--device", "cpu", "--host", "pytorch-worker",
                  "--port", "8000", "--redis-url", "redis://redis:6379/0"], id="compose-cpu"),
    pytest.param(["--model", "smollm2", "--device", "cuda", "--host", "pytorch-worker-gpu",
                  "--port", "8000", "--redis-url", "redis://redis:6379/0"], id="compose-gpu"),
    pytest.param(["--model", "smollm2", "--device", "cuda", "--host", "$(POD_IP)", "--port",
                  "8000", "--redis-url", "$(REDIS_URL)"], id="k8s"),
    pytest.param(["--model", "smollm2", "--device", "auto", "--host", "10.0.0.7", "--port",
                  "8000", "--redis-url", "redis://r:6379"], id="auto"),
])
def test_the_deploy_commands_parse(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert resolve_model(args.model) is None  # the bundled model
    assert args.port == 8000 and args.redis_url


def test_flags_become_the_engine_settings() -> None:
    config = config_from_args(build_parser().parse_args([
        "--kv-blocks", "300", "--kv-dtype", "int8", "--max-batch", "8",
        "--max-num-batched-tokens", "128", "--block-size", "32", "--max-context-tokens", "2048",
        "--port", "9001", "--device", "cpu", "--dtype", "bfloat16", "--num-threads", "2"]))
    assert config.model_path is None and config.served_model_name == "SmolLM2-135M-Instruct"
    assert config.worker_id.startswith("worker-") and config.worker_id.endswith("-9001")
    assert config.url == "http://127.0.0.1:9001" and config.redis_url is None
    engine = config.engine
    assert (engine.num_kv_blocks, engine.kv_dtype, engine.block_size) == (300, "int8", 32)
    assert (engine.max_batch, engine.max_num_batched_tokens) == (8, 128)
    assert engine.max_context_tokens == 2048
    assert (config.device, config.dtype, config.num_threads) == ("cpu", "bfloat16", 2)


def test_defaults_leave_the_engine_its_own() -> None:
    from backends.worker.engine import EngineConfig

    config = config_from_args(build_parser().parse_args(["--served-model-name", "smol"]))
    defaults = EngineConfig()
    assert config.served_model_name == "smol"
    assert config.engine.max_batch == defaults.max_batch
    assert config.engine.num_kv_blocks is None and config.engine.kv_dtype is None
    assert config.device == "auto" and config.prefill_probe_tokens > 0


def test_a_model_path_names_the_served_model(tmp_path: Path) -> None:
    (tmp_path / "my-llama").mkdir()
    (tmp_path / "tiny.Q8_0.gguf").write_bytes(b"")
    for model, name in ((tmp_path / "my-llama", "my-llama"),
                        (tmp_path / "tiny.Q8_0.gguf", "tiny.Q8_0")):
        config = config_from_args(build_parser().parse_args(["--model", str(model)]))
        assert config.model_path == model and config.served_model_name == name


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--kv-blocks", "10", "--kv-gib", "1"], "not allowed with argument",
                 id="two-kv-sizes"),
    pytest.param(["--device", "tpu"], "invalid choice", id="unknown-device"),
    pytest.param(["--kv-dtype", "int4"], "invalid choice", id="unknown-kv-dtype"),
    pytest.param(["--max-batch", "0"], "must be > 0", id="zero-batch"),
    pytest.param(["--kv-gib", "lots"], "expected a float", id="kv-gib-not-a-number"),
])
def test_bad_flags_are_refused(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_missing_model_says_what_to_give() -> None:
    with pytest.raises(SystemExit, match="'smollm2' for the bundled"):
        config_from_args(build_parser().parse_args(["--model", "/no/such/model.gguf"]))


def test_switchyard_worker_dispatches_to_this_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        switchyard_main(["worker", "--help"])
    assert exit_info.value.code == 0
    assert "--kv-dtype" in capsys.readouterr().out


def test_parsing_does_not_import_torch() -> None:
    code = ("import sys, backends.worker.cli as c; c.build_parser().parse_args([]); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "False"
