"""Per-request behaviour of the engine: sampling, the ways a request stops, and bad requests."""

from __future__ import annotations

from typing import Any

import pytest

from backends.worker.engine import LLMEngine
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from tests.backends.worker.checkpoints import tiny_model
from tests.backends.worker.engine_support import CharTokenizer, make_engine, prompt

PROMPT = prompt(5, 7)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model()


@pytest.fixture(scope="module")
def greedy_ids(model: LlamaModel) -> tuple[int, ...]:
    (completion,) = make_engine(model).generate(
        [PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))
    return completion.token_ids


def test_max_tokens_finishes_with_length(model: LlamaModel,
                                         greedy_ids: tuple[int, ...]) -> None:
    (completion,) = make_engine(model).generate(
        [PROMPT], SamplingParams(max_tokens=5, ignore_eos=True))
    assert (completion.token_ids, completion.finish_reason) == (greedy_ids[:5], "length")
    assert completion.text == CharTokenizer().decode(greedy_ids[:5], skip_special_tokens=True)


def test_eos_finishes_with_stop(model: LlamaModel, greedy_ids: tuple[int, ...]) -> None:
    tokenizer = CharTokenizer()
    tokenizer.eos_token_id = greedy_ids[3]  # make the model "say" EOS as its 4th token
    engine = LLMEngine(model, tokenizer, make_engine(model).config)
    (stopped,) = engine.generate([PROMPT], SamplingParams(max_tokens=12))
    assert (stopped.token_ids, stopped.finish_reason, stopped.stop_reason) == (
        greedy_ids[:4], "stop", None)
    assert stopped.text == tokenizer.decode(greedy_ids[:3])  # EOS is counted, not shown
    (ignored,) = engine.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))
    assert (ignored.token_ids, ignored.finish_reason) == (greedy_ids, "length")


def test_stop_token_ids(model: LlamaModel, greedy_ids: tuple[int, ...]) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=(greedy_ids[2],))
    (completion,) = make_engine(model).generate([PROMPT], params)
    first = greedy_ids.index(greedy_ids[2])
    assert completion.token_ids == greedy_ids[:first + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", greedy_ids[2])


def test_stop_string_truncates_the_text(model: LlamaModel, greedy_ids: tuple[int, ...]) -> None:
    full_text = CharTokenizer().decode(greedy_ids, skip_special_tokens=True)
    stop = full_text[4:6]
    params = SamplingParams(max_tokens=12, ignore_eos=True, stop=(stop, "never-said"))
    engine = make_engine(model)
    engine.add_request("r", PROMPT, params)
    deltas, finish = [], None
    while engine.has_work:
        for output in engine.step():
            deltas.append(output.text_delta)
            finish = (output.finish_reason, output.stop_reason)
    text = "".join(deltas)
    assert text == full_text[:full_text.index(stop)]
    assert finish == ("stop", stop)
    assert all(stop not in delta for delta in deltas)
    assert engine.block_manager.num_used_blocks == 0


def test_top_k_one_equals_greedy(model: LlamaModel, greedy_ids: tuple[int, ...]) -> None:
    params = SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True)
    (completion,) = make_engine(model).generate([PROMPT], params)
    assert completion.token_ids == greedy_ids


def test_seeded_request_is_reproducible_whatever_its_batch_mates(model: LlamaModel) -> None:
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    mates = SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True)
    (alone,) = make_engine(model).generate([PROMPT], seeded)
    crowded = make_engine(model, max_num_batched_tokens=5).generate(
        [prompt(8, 9), PROMPT, prompt(9, 4)], [mates, seeded, mates])
    assert crowded[1].token_ids == alone.token_ids
    (other_seed,) = make_engine(model).generate(
        [PROMPT], SamplingParams(temperature=1.0, seed=43, max_tokens=12, ignore_eos=True))
    assert other_seed.token_ids != alone.token_ids


def test_seeded_request_survives_preemption(model: LlamaModel) -> None:
    prompts = [prompt(seed, 9) for seed in range(3)]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=14, ignore_eos=True)
              for seed in range(3)]
    roomy = make_engine(model, num_kv_blocks=64).generate(prompts, params)
    tight = make_engine(model, num_kv_blocks=14)
    assert tight.generate(prompts, params) == roomy
    assert tight.load().num_preemptions > 0


@pytest.mark.parametrize(
    ("ids", "kwargs", "message"),
    [
        pytest.param([], {}, "the prompt must have at least one token", id="empty-prompt"),
        pytest.param([5, 96, 3], {}, r"prompt token ids must be integers in \[0, 96\); got "
                     r"\[96\]", id="token-out-of-vocab"),
        pytest.param([5, 1.5, -1], {}, r"got \[1.5, -1\]", id="not-token-ids"),
        pytest.param(list(range(4, 90)) * 2, {"max_tokens": 10},
                     "exceeds this worker's max_context_tokens", id="too-long"),
        pytest.param(list(range(4, 60)), {"max_tokens": 20}, "needs 19 KV blocks",
                     id="never-fits-the-cache"),
    ],
)
def test_requests_that_can_never_be_served(model: LlamaModel, ids: list[int],
                                           kwargs: dict[str, Any], message: str) -> None:
    engine = make_engine(model, num_kv_blocks=16, max_context_tokens=128)
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", ids, SamplingParams(**kwargs))
    assert not engine.has_work


def test_duplicate_request_id(model: LlamaModel) -> None:
    engine = make_engine(model)
    engine.add_request("r", PROMPT, SamplingParams())
    with pytest.raises(ValueError, match="'r' is already queued or running"):
        engine.add_request("r", PROMPT, SamplingParams())


def test_engine_config_errors(model: LlamaModel) -> None:
    with pytest.raises(ValueError, match=r"max_context_tokens \(4096\) exceeds the model's "
                                         r"context length \(128\)"):
        make_engine(model, max_context_tokens=4096)
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        make_engine(model, kv_dtype="fp8")
