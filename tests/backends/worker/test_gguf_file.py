from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from backends.worker.errors import ModelFormatError
from backends.worker.gguf_file import read_dequantized, read_tensor_infos

Q = gguf.GGMLQuantizationType


def _write(path: Path, alignment: int | None) -> Path:
    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # string arrays are skipped
    writer.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5])
    for name, qtype, shape in [("f32", Q.F32, (3, 5)), ("vector", Q.F32, (7,)),
                               ("f16", Q.F16, (4, 64)), ("bf16", Q.BF16, (2, 64)),
                               ("q8_0", Q.Q8_0, (6, 64)), ("q4_1", Q.Q4_1, (5, 96))]:
        array = rng.standard_normal(shape).astype(np.float32)
        if qtype == Q.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [pytest.param(None, id="default-alignment"),
                                       pytest.param(64, id="alignment-64")])
def test_agrees_with_gguf_reader(tmp_path: Path, alignment: int | None) -> None:
    path = _write(tmp_path / "mixed.gguf", alignment)
    reader = gguf.GGUFReader(path)
    infos = read_tensor_infos(path)
    assert [(i.name, i.tensor_type, i.offset_bytes, i.num_bytes) for i in infos] == [
        (t.name, t.tensor_type, t.data_offset, t.n_bytes) for t in reader.tensors]
    arrays = dict(read_dequantized(path))
    for tensor in reader.tensors:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert arrays[tensor.name].dtype == np.float32
        assert arrays[tensor.name].shape == tuple(reversed(tensor.shape.tolist()))
        np.testing.assert_array_equal(arrays[tensor.name], expected.reshape(
            arrays[tensor.name].shape), err_msg=tensor.name)
        assert arrays[tensor.name].flags.writeable


def test_rejects_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        read_tensor_infos(path)


def test_rejects_a_truncated_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "whole.gguf", None)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match="past the end"):
        read_tensor_infos(truncated)
