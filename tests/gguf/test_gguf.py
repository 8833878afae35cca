"""The GGUF reader: values against gguf-py, and a clear ember.GGUFError for every kind of bad file."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_builder import ARRAY, F32, STRING, U32, U64, Tensor, build, small_model

import ember


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_small_file_values(tmp_path):
    f = ember.GGUFFile(write(tmp_path, small_model().data))
    md = f.metadata
    assert f.version == 3 and f.alignment == 32
    assert md["general.architecture"] == "llama"
    assert md["test.u8"] == 7 and md["test.i64"] == -5 and md["test.f64"] == 0.25
    assert md["test.bool"] is True
    assert md["test.strings"] == ["a", "bc", "héllo"]
    assert md["test.floats"] == [0.5, -1.5]
    assert md["test.nested"] == [[1, 2], [3]]
    names = [(t.name, t.type, t.shape, t.offset, t.n_bytes) for t in f.tensors]
    assert names == [("a.weight", "f32", (4, 16), 0, 256), ("b.weight", "f32", (32,), 256, 128)]
    raw = f.raw("a.weight")
    assert raw.dtype == np.uint8 and not raw.flags.writeable
    assert np.array_equal(raw.view(np.float32), np.arange(64, dtype=np.float32))


def test_matches_gguf_py_on_real_file(stories_path):
    ours = ember.GGUFFile(str(stories_path))
    ref = gguf.GGUFReader(stories_path)
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors):
        assert mine.type == theirs.tensor_type.name.lower()
        assert mine.shape == tuple(int(d) for d in reversed(theirs.shape))
        assert ours.data_offset + mine.offset == theirs.data_offset
        assert mine.n_bytes == theirs.n_bytes
        assert np.array_equal(ours.raw(mine.name), np.asarray(theirs.data).reshape(-1).view(np.uint8))
    md = ours.metadata
    for name, fld in ref.fields.items():
        if name.startswith("GGUF."):
            continue
        value = fld.contents()
        if isinstance(value, float):
            assert md[name] == pytest.approx(value, rel=1e-7)
        elif isinstance(value, list) and value and isinstance(value[0], float):
            assert np.allclose(md[name], value)
        else:
            assert md[name] == value, name


def test_raw_view_outlives_file_object(stories_path):
    raw = ember.GGUFFile(str(stories_path)).raw("output_norm.weight")
    import gc
    gc.collect()
    assert raw.view(np.float32).shape == (64,)
    assert np.isfinite(raw.view(np.float32)).all()


def test_gguf_version_2_reads(tmp_path):
    f = ember.GGUFFile(write(tmp_path, small_model(version=2).data))
    assert f.version == 2 and len(f.tensors) == 2


def expect_error(tmp_path: Path, data: bytes, *fragments: str) -> str:
    path = write(tmp_path, data)
    with pytest.raises(ember.GGUFError) as info:
        ember.GGUFFile(path)
    message = str(info.value)
    assert path in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ember.GGUFError, match="cannot open"):
        ember.GGUFFile(str(tmp_path / "absent.gguf"))
    with pytest.raises(ember.GGUFError, match="directory"):
        ember.GGUFFile(str(tmp_path))


def test_empty_file(tmp_path):
    expect_error(tmp_path, b"", "empty")


def test_wrong_magic(tmp_path):
    expect_error(tmp_path, small_model(magic=b"GGML").data, "not a GGUF file", "'GGML'")


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000])
def test_unsupported_versions(tmp_path, version):
    message = expect_error(tmp_path, small_model(version=version).data, "header")
    if version == 0x03000000:
        assert "big-endian" in message
    elif version == 1:
        assert "version 1 is not supported" in message
    else:
        assert f"unsupported GGUF version {version}" in message


def test_truncated_everywhere(tmp_path):
    data = small_model().data
    # Every cut inside the header and directory fails with a message; none crashes.
    for cut in range(1, small_model().offsets["data"]):
        path = write(tmp_path, data[:cut], f"cut{cut}.gguf")
        with pytest.raises(ember.GGUFError) as info:
            ember.GGUFFile(path)
        assert path in str(info.value)


def test_tensor_data_past_end(tmp_path):
    built = small_model()
    data = patch(built.data, built.offsets["tensor:b.weight:offset"], "<Q", 1 << 20)
    expect_error(tmp_path, data, "tensor 'b.weight'", "past the end of the file")
    # Truncating the data section is the same mistake seen from the other side.
    expect_error(tmp_path, built.data[:-4], "tensor 'b.weight'", "past the end")


def test_offset_overflow(tmp_path):
    built = small_model()
    data = patch(built.data, built.offsets["tensor:b.weight:offset"], "<Q", (1 << 64) - 32)
    expect_error(tmp_path, data, "tensor 'b.weight'", "past the end")


def test_dims_overflow(tmp_path):
    built = small_model()
    at = built.offsets["tensor:a.weight:shape"]
    data = patch(patch(built.data, at, "<Q", 1 << 40), at + 8, "<Q", 1 << 40)
    expect_error(tmp_path, data, "tensor 'a.weight'", "overflows")
    data = patch(built.data, at, "<Q", 1 << 63)
    expect_error(tmp_path, data, "tensor 'a.weight'", "too large")


def test_too_many_dims(tmp_path):
    built = small_model()
    data = patch(built.data, built.offsets["tensor:a.weight:n_dims"], "<I", 9)
    expect_error(tmp_path, data, "tensor 'a.weight'", "9 dimensions")


@pytest.mark.parametrize("field", ["n_tensors", "n_kv"])
def test_counts_larger_than_file(tmp_path, field):
    built = small_model()
    data = patch(built.data, built.offsets[field], "<Q", (1 << 64) - 1)
    expect_error(tmp_path, data, "count", "cannot fit")


def test_duplicate_tensor_names(tmp_path):
    t = [Tensor("same", [4], 0, bytes(16)), Tensor("same", [4], 0, bytes(16))]
    expect_error(tmp_path, small_model(tensors=t).data, "tensor 'same'", "duplicate tensor name")


def test_duplicate_keys(tmp_path):
    kv = [("k", U32, 1), ("k", U32, 2)]
    expect_error(tmp_path, small_model(kv=kv).data, "metadata 'k'", "duplicate key")


def test_unknown_tensor_type(tmp_path):
    built = small_model()
    data = patch(built.data, built.offsets["tensor:a.weight:type"], "<I", 99)
    expect_error(tmp_path, data, "tensor 'a.weight'", "unknown tensor type id 99")


def test_unknown_value_type(tmp_path):
    built = small_model()
    key_at = built.offsets["kv:test.u8"]
    type_at = key_at + 8 + len("test.u8")
    data = patch(built.data, type_at, "<I", 77)
    expect_error(tmp_path, data, "metadata 'test.u8'", "unknown value type 77")


def test_string_longer_than_file(tmp_path):
    built = small_model()
    data = patch(built.data, built.offsets["kv:general.architecture:value"], "<Q", 1 << 62)
    expect_error(tmp_path, data, "metadata 'general.architecture'", "string length")


def test_array_longer_than_file(tmp_path):
    built = small_model()
    at = built.offsets["kv:test.floats:value"] + 4  # after the element type
    data = patch(built.data, at, "<Q", 1 << 61)
    expect_error(tmp_path, data, "metadata 'test.floats'", "cannot fit")
    at = built.offsets["kv:test.strings:value"] + 4
    data = patch(built.data, at, "<Q", 1 << 61)
    expect_error(tmp_path, data, "metadata 'test.strings'", "cannot fit")


def test_block_size_mismatch(tmp_path):
    # q4_0 (type 2) needs the first dimension to be a multiple of 32.
    t = [Tensor("q", [48], 2, bytes(18 * 2))]
    expect_error(tmp_path, small_model(tensors=t).data, "tensor 'q'", "multiple of the q4_0 block size 32")


def test_bad_alignment(tmp_path):
    kv = [("general.alignment", U32, 24)]
    expect_error(tmp_path, small_model(kv=kv, tensors=[]).data, "general.alignment", "power of two")
    kv = [("general.alignment", U64, 32)]
    expect_error(tmp_path, small_model(kv=kv, tensors=[]).data, "general.alignment", "expected u32")


def test_misaligned_tensor_offset(tmp_path):
    t = [Tensor("x", [4], 0, bytes(16), offset=4)]
    expect_error(tmp_path, small_model(tensors=t).data, "tensor 'x'", "not a multiple of the alignment")


def test_custom_alignment_is_honoured(tmp_path):
    kv = [("general.alignment", U32, 64)]
    t = [Tensor("x", [4], 0, np.ones(4, np.float32).tobytes()),
         Tensor("y", [4], 0, np.full(4, 2, np.float32).tobytes())]
    f = ember.GGUFFile(write(tmp_path, build(kv, t, alignment=64).data))
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert [t.offset for t in f.tensors] == [0, 64]
    assert np.array_equal(f.raw("y").view(np.float32), np.full(4, 2, np.float32))


def test_unknown_tensor_name_is_key_error(stories_path):
    f = ember.GGUFFile(str(stories_path))
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        f.raw("nope")


def test_wrong_element_type_strings(tmp_path):
    kv = [("arr", ARRAY, (ARRAY, [(STRING, ["x"]), (F32, [1.0])]))]
    f = ember.GGUFFile(write(tmp_path, small_model(kv=kv, tensors=[]).data))
    assert f.metadata["arr"] == [["x"], [1.0]]
