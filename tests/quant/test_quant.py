"""ember's reference quantizers against gguf-py (gguf.quants), bit for bit.

Every run draws fresh random blocks; the seed is in each assertion message so a failure can be
replayed with EMBER_TEST_SEED=<seed>.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import ember._core as core

SEED = int(os.environ.get("EMBER_TEST_SEED", int.from_bytes(os.urandom(4), "little")))

DEQUANT_TYPES = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4",
    "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
]  # fmt: skip
# bit-identical to gguf-py
QUANT_TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "tq1_0", "tq2_0", "mxfp4"]
K_QUANT_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]  # gguf-py cannot write these

# Byte offsets of the f16 scale fields inside each block (see cpp/quant/blocks.h).
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
    "q2_k": [80, 82], "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208],
    "iq4_nl": [0], "iq4_xs": [0], "tq1_0": [52], "tq2_0": [64],
    "iq2_xxs": [0], "iq2_xs": [0], "iq2_s": [0], "iq3_xxs": [0], "iq3_s": [0], "iq1_s": [0],
}  # fmt: skip

# numpy's float -> uint8 cast of inf/NaN (which extreme inputs reach inside gguf-py's quantizers)
# differs between x86-64 and aarch64; ember reproduces the x86-64 one.
X86 = platform.machine().lower() in ("x86_64", "amd64")


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng([SEED, *name.encode()])


def gguf_type(name: str) -> GT:
    return GT[name.upper()]


def block_shape(name: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[gguf_type(name)]


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random f16 bit patterns, any finite value (zeros and subnormals included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_or_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_or_nan] &= 0xBFFF  # clear the top exponent bit: now finite
    return bits


def random_raw(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks random blocks of type `name` as a flat uint8 array, every f16 scale finite."""
    _, type_size = block_shape(name)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS.get(name, []):
        raw[:, offset : offset + 2] = (
            finite_f16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        )
    return raw.reshape(-1)


def reference_dequantize(name: str, raw: np.ndarray) -> np.ndarray:
    """gguf-py's values for raw bytes of type `name`, as flat float32."""
    # mxfp4: its largest scales times its codebook reach inf; iq1_m: its f16 d (spread over the
    # scale words, left random) can be inf or NaN
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(gguf_dequantize(raw, gguf_type(name)), dtype=np.float32).reshape(-1)


def assert_same_bits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, (
        f"{what}: {ours.dtype}{ours.shape} vs {ref.dtype}{ref.shape}"
    )
    view = np.uint32 if ours.dtype == np.float32 else np.uint8
    a, b = ours.view(view), ref.view(view)
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a != b)
        i = bad[0]
        pytest.fail(
            f"{what} (seed {SEED}): {bad.size} of {a.size} differ, first at {i}: {ours[i]!r} vs {ref[i]!r}"
        )


# ---- dequantize ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DEQUANT_TYPES)
def test_dequantize_random_blocks_match_gguf_py(name: str) -> None:
    rng = rng_for(name)
    block_size, _ = block_shape(name)
    n_blocks = max(4096 // block_size, 64) * 16  # every nibble / bit position many times over
    raw = random_raw(name, n_blocks, rng)
    n = n_blocks * block_size
    ours = core.dequantize(name, raw, n)
    assert ours.dtype == np.float32 and ours.shape == (n,)
    assert_same_bits(ours, reference_dequantize(name, raw), f"dequantize {name}")
    # bytes input and upper-case names take the same path
    assert_same_bits(
        core.dequantize(name.upper(), raw.tobytes(), n), ours, f"dequantize {name} from bytes"
    )


@pytest.mark.parametrize("name", ["q4_0", "q5_1", "q3_k", "iq4_xs", "f16"])
def test_dequantize_unaligned_and_longer_source(name: str) -> None:
    rng = rng_for(name)
    block_size, type_size = block_shape(name)
    raw = random_raw(name, 33, rng)
    padded = np.zeros(raw.size + 9, dtype=np.uint8)
    padded[1 : 1 + raw.size] = raw
    unaligned = padded[1:]  # odd address, and 8 bytes longer than needed
    ours = core.dequantize(name, unaligned, 32 * block_size)
    assert_same_bits(
        ours, reference_dequantize(name, raw[: 32 * type_size]), f"dequantize {name} unaligned"
    )


def test_f16_and_bf16_every_bit_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    assert_same_bits(
        core.dequantize("f16", bits, 1 << 16), reference_dequantize("f16", bits), "f16 -> f32"
    )
    assert_same_bits(
        core.dequantize("bf16", bits, 1 << 16), reference_dequantize("bf16", bits), "bf16 -> f32"
    )


def test_dequantize_large_array_uses_threads_identically() -> None:
    rng = rng_for("large")
    raw = random_raw("q4_k", 8192, rng)  # 2M elements: split over the thread pool
    assert_same_bits(
        core.dequantize("q4_k", raw, 8192 * 256), reference_dequantize("q4_k", raw), "q4_k large"
    )


# ---- quantize --------------------------------------------------------------------------------


def quantize_inputs(rng: np.random.Generator) -> np.ndarray:
    """Rows of 256 float32 that exercise every branch: d == 0, ties, extremes, one-hot blocks."""
    rows = [rng.standard_normal(256) * scale for scale in (1e-6, 0.02, 1.0, 300.0, 1e4, 1e30)]
    rows += [
        np.zeros(256),
        np.full(256, 0.5),
        np.full(256, -3.0),
        np.full(256, 1e-30),
        rng.uniform(0, 1, 256),  # all positive: q4_1 min > 0
        -rng.uniform(0, 1, 256),
        np.where(rng.uniform(size=256) < 0.9, 0.0, rng.standard_normal(256)),  # sparse
        np.tile(np.r_[127.0, np.arange(-15, 16) + 0.5], 8),  # q8_0 half-way ties, d == 1
        np.tile(np.r_[-8.0, np.arange(-15, 16) / 2.0], 8),  # q4_0 exact steps, d == 1
        rng.integers(-16, 16, 256).astype(np.float64),
        rng.standard_normal(256) * 10.0 ** rng.integers(-20, 20, 256),  # mixed magnitudes
    ]
    one_hot = np.zeros(256)
    one_hot[rng.integers(0, 256, 8)] = rng.standard_normal(8)
    rows.append(one_hot)
    if X86:
        # f32 subnormals: d is nonzero but 1 / d overflows to inf, so gguf-py casts inf/NaN to bytes.
        rows.append(rng.standard_normal(256) * 1e-40)
    rows += [rng.standard_normal(256) for _ in range(64)]
    return np.asarray(rows, dtype=np.float32)


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_quantize_matches_gguf_py(name: str) -> None:
    data = quantize_inputs(rng_for(name))
    ours = core.quantize(data, name)
    with np.errstate(all="ignore"):  # gguf-py warns on the extreme rows
        ref = np.ascontiguousarray(gguf_quantize(data, gguf_type(name))).view(np.uint8).reshape(-1)
    assert_same_bits(np.frombuffer(ours, dtype=np.uint8), ref, f"quantize {name}")


def double_rounding_input(id_: np.float32, target: float) -> np.float32 | None:
    """An x whose product x * id_ rounds in float32 to `target` exactly, while the exact product
    is smaller: adding the offset then ties (and rounds up to an integer) in two float32 steps,
    but a fused multiply-add would round once, just below the integer. None if no x near."""
    x0 = np.float32(target / float(id_))
    for step in range(-64, 65):
        x = np.float32(x0 + step * np.spacing(x0))
        if x * id_ == np.float32(target) and float(x) * float(id_) < target:
            return x
    return None


@pytest.mark.parametrize("name", ["q4_0", "q5_0", "q4_1", "q5_1"])
def test_quantize_rounds_each_operation_like_numpy(name: str) -> None:
    """trunc(x * id + offset) must round the product and the sum separately, as numpy does."""
    symmetric = name.endswith("_0")
    levels = {"q4_0": 8, "q5_0": 16, "q4_1": 15, "q5_1": 31}[name]
    offset = levels + 0.5 if symmetric else 0.5
    # The sum must land half a float32 step below an integer, with the product in a finer binade.
    integer = int(offset) + 1
    step_below = float(np.float32(integer) - np.nextafter(np.float32(integer), np.float32(0)))
    target = integer - offset - step_below / 2
    for scale in np.linspace(0.3, 3.0, 200, dtype=np.float32):  # until some block scale d works
        block = np.zeros(32, dtype=np.float32)
        if symmetric:
            block[0] = np.float32(-levels) * scale  # the extreme value: d = scale
            id_ = np.float32(1) / (block[0] / np.float32(-levels))
        else:
            block[1] = np.float32(levels) * scale  # max; min is block[0] == 0, so x - min == x
            id_ = np.float32(1) / (block[1] / np.float32(levels))
        x = double_rounding_input(id_, target)
        if x is not None:
            break
    assert x is not None
    block[2:] = x
    two_roundings = np.trunc(x * id_ + np.float32(offset))
    one_rounding = np.trunc(np.float32(float(x) * float(id_) + offset))
    assert two_roundings == integer and one_rounding == integer - 1  # the input discriminates
    ref = np.ascontiguousarray(gguf_quantize(block, gguf_type(name))).view(np.uint8).reshape(-1)
    assert_same_bits(
        np.frombuffer(core.quantize(block, name), dtype=np.uint8), ref, f"quantize {name} rounding"
    )


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_quantize_shapes_and_conversion(name: str) -> None:
    rng = rng_for(name)
    data = rng.standard_normal((3, 4, 256)).astype(np.float32)
    flat = core.quantize(data.reshape(-1), name)
    assert core.quantize(data, name) == flat  # any leading shape: same blocks in C order
    assert core.quantize(data.astype(np.float64), name) == flat  # converted to float32 first
    transposed = np.ascontiguousarray(data.transpose(1, 0, 2))
    assert core.quantize(data.transpose(1, 0, 2), name) == core.quantize(transposed, name)


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_float_rounding_of_many_bit_patterns(name: str) -> None:
    """Every sign/exponent/top-mantissa prefix with the rounding-relevant low bits varied."""
    high = np.arange(1 << 19, dtype=np.uint32) << 13
    lows = [0, 1, 0x0800, 0x0FFF, 0x1000, 0x1001, 0x1FFF]
    rng = rng_for(name)
    bits = np.concatenate(
        [high | low for low in lows] + [rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32)]
    )
    values = bits.view(np.float32)
    with np.errstate(all="ignore"):
        ref = (
            np.ascontiguousarray(gguf_quantize(values, gguf_type(name))).view(np.uint8).reshape(-1)
        )
    assert_same_bits(
        np.frombuffer(core.quantize(values, name), dtype=np.uint8), ref, f"f32 -> {name}"
    )


def test_round_trip_error_is_small() -> None:
    data = rng_for("round_trip").standard_normal((64, 256)).astype(np.float32)
    bound = {
        "q4_0": 0.12,
        "q4_1": 0.1,
        "q5_0": 0.06,
        "q5_1": 0.05,
        "q8_0": 0.01,
        "f16": 1e-3,
        "bf16": 5e-3,
    }
    for name, max_rms in bound.items():
        back = core.dequantize(name, core.quantize(data, name), data.size).reshape(data.shape)
        rms = float(np.sqrt(np.mean((back - data) ** 2)))
        assert rms < max_rms, f"{name}: rms error {rms}"


# ---- k-quant quantizers (llama.cpp's reference search; gguf-py has none) -------------------

# sha256 prefixes of the blocks llama.cpp's quantize_row_qX_K_ref (ggml d99724f2, built without
# FMA contraction) writes for the two inputs below, whose own hashes come first.
GGML_TEST_INPUT = "65e6b4f2efc5b241"  # 0.1 + 2 cos(i), i < 4096: ggml's test-quantize-fns data
NORMAL_INPUT = "6933451c820438af"  # default_rng(12345).standard_normal(4096) * 0.05, float32
LLAMA_CPP_K_BLOCKS = {
    "q2_k": ("8769945b59ba9fa8", "7d3e2c6256be21a3"),
    "q3_k": ("08b8f2a04166c2a4", "b42c0a28c38547f7"),
    "q4_k": ("c5b0ab128cca9069", "b54e667746a7afe4"),
    "q5_k": ("031cc3b5b2266ee6", "2a4d37a0dabfa102"),
    "q6_k": ("8b76c8de301bb3d0", "02aec19d1ea2c816"),
}
# rms error of llama.cpp's reference on standard normal data (measured, 65536 values).
LLAMA_CPP_K_RMS = {
    "q2_k": 0.2970,
    "q3_k": 0.1507,
    "q4_k": 0.07157,
    "q5_k": 0.03612,
    "q6_k": 0.01775,
}
# ggml's test-quantize-fns bounds on sqrt(sum of squared errors) / n for its cos data.
GGML_TOTAL_ERROR = {"q2_k": 0.0075, "q3_k": 0.0040, "q4_k": 0.002, "q5_k": 0.002, "q6_k": 0.002}


def sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@pytest.mark.parametrize("name", K_QUANT_TYPES)
def test_k_quant_blocks_equal_llama_cpp_reference(name: str) -> None:
    cos_data = (0.1 + 2 * np.cos(np.arange(4096.0))).astype(np.float32)
    normal = np.random.default_rng(12345).standard_normal(4096).astype(np.float32) * np.float32(
        0.05
    )
    if sha16(cos_data.tobytes()) != GGML_TEST_INPUT or sha16(normal.tobytes()) != NORMAL_INPUT:
        pytest.skip("this platform's numpy generates different inputs")
    assert (
        sha16(core.quantize(cos_data, name)),
        sha16(core.quantize(normal, name)),
    ) == LLAMA_CPP_K_BLOCKS[name]


@pytest.mark.parametrize("name", K_QUANT_TYPES)
def test_k_quant_round_trip_error_matches_llama_cpp(name: str) -> None:
    cos_data = (0.1 + 2 * np.cos(np.arange(4096.0))).astype(np.float32)
    back = core.dequantize(name, core.quantize(cos_data, name), cos_data.size)
    total_error = float(np.sqrt(np.sum((back.astype(np.float64) - cos_data) ** 2)) / cos_data.size)
    assert total_error < GGML_TOTAL_ERROR[name]

    data = rng_for(name).standard_normal((256, 256)).astype(np.float32)
    back = core.dequantize(name, core.quantize(data, name), data.size).reshape(data.shape)
    rms = float(np.sqrt(np.mean((back - data) ** 2)))
    assert rms < 1.03 * LLAMA_CPP_K_RMS[name], (
        f"{name}: rms {rms} vs llama.cpp {LLAMA_CPP_K_RMS[name]} (seed {SEED})"
    )


@pytest.mark.parametrize("name", K_QUANT_TYPES)
def test_k_quant_special_blocks(name: str) -> None:
    rows = np.zeros((4, 256), dtype=np.float32)
    rows[1] = 0.75  # constant
    rows[2, ::17] = 3.0  # sparse, positive
    rows[3] = -rng_for(name).uniform(0.5, 1.0, 256)  # all negative
    back = core.dequantize(name, core.quantize(rows, name), rows.size).reshape(rows.shape)
    assert np.array_equal(back[0], rows[0])  # zeros stay exactly zero
    assert np.all(np.isfinite(back))
    assert float(np.max(np.abs(back - rows))) < 0.5


def test_k_quant_threaded_equals_row_by_row() -> None:
    data = rng_for("k_threads").standard_normal((1100, 256)).astype(np.float32)  # > 2^18 elements
    whole = core.quantize(data, "q4_k")
    for i in range(0, 1100, 100):
        assert whole[i * 144 : (i + 1) * 144] == core.quantize(data[i], "q4_k")


# ---- iq4 quantizers (llama.cpp's search; gguf-py has none) -----------------------------------

# rms error of llama.cpp's quantize_iq4_nl / quantize_iq4_xs (ggml_quantize_chunk, no imatrix) on
# default_rng(0).standard_normal((256, 256)) float32, measured through its libggml-base; ember
# wrote the same bytes.
LLAMA_CPP_IQ4_RMS = {"iq4_nl": 0.07645, "iq4_xs": 0.07698}


@pytest.mark.parametrize("name", list(LLAMA_CPP_IQ4_RMS))
def test_iq4_round_trip_error_matches_llama_cpp(name: str) -> None:
    data = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    back = core.dequantize(name, core.quantize(data, name), data.size).reshape(data.shape)
    rms = float(np.sqrt(np.mean((back - data) ** 2)))
    assert rms < LLAMA_CPP_IQ4_RMS[name] + 5e-6, f"{name}: rms {rms} vs llama.cpp {LLAMA_CPP_IQ4_RMS[name]}"
    rows = np.zeros((2, 256), dtype=np.float32)
    rows[1, ::17] = 3.0
    back = core.dequantize(name, core.quantize(rows, name), rows.size).reshape(rows.shape)
    assert np.array_equal(back[0], rows[0]) and float(np.max(np.abs(back[1] - rows[1]))) < 0.1


# ---- errors ----------------------------------------------------------------------------------


def test_unknown_type_name() -> None:
    with pytest.raises(
        ValueError, match=r"unknown type name 'q9_9'; expected one of: f32, f16, q4_0"
    ):
        core.dequantize("q9_9", b"", 0)
    with pytest.raises(ValueError, match=r"unknown type name 'int4'"):
        core.quantize(np.zeros(32, np.float32), "int4")


def test_wrong_lengths() -> None:
    with pytest.raises(ValueError, match=r"q4_0: 64 elements need 36 bytes of data, got 35"):
        core.dequantize("q4_0", bytes(35), 64)
    with pytest.raises(
        ValueError, match=r"q4_k: 300 elements is not a whole number of blocks of 256"
    ):
        core.dequantize("q4_k", bytes(1000), 300)
    with pytest.raises(ValueError, match=r"-32 elements"):
        core.dequantize("q8_0", bytes(34), -32)
    with pytest.raises(
        ValueError, match=r"q8_0: 48 elements is not a whole number of blocks of 32"
    ):
        core.quantize(np.zeros((2, 48), np.float32), "q8_0")  # 96 elements, but rows of 48
    with pytest.raises(ValueError, match=r"at least one dimension"):
        core.quantize(np.float32(1.0), "f16")


def test_unsupported_types_list_the_supported_ones() -> None:
    with pytest.raises(
        ValueError, match=r"type 'q8_k' cannot be dequantized; types that can: f32, f16, q4_0"
    ):
        core.dequantize("q8_k", bytes(292), 256)
    with pytest.raises(
        ValueError, match=r"type 'iq2_xxs' cannot be quantized; types that can: f32, f16, q4_0, q4_1"
    ):
        core.quantize(np.zeros(256, np.float32), "iq2_xxs")


def test_raw_must_be_bytes_or_uint8() -> None:
    with pytest.raises(TypeError):
        core.dequantize("f32", np.zeros(4, np.float32), 4)


# ---- real model files ------------------------------------------------------------------------


def check_every_tensor(path: Path) -> int:
    """Dequantizes every tensor of a GGUF file with ember and gguf-py; returns the number checked."""
    reader = gguf.GGUFReader(path)
    for tensor in reader.tensors:
        name = tensor.tensor_type.name.lower()
        raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(-1)
        n = int(tensor.n_elements)
        ours = core.dequantize(name, raw, n)
        assert_same_bits(
            ours, reference_dequantize(name, raw), f"{path.name}: {tensor.name} ({name})"
        )
    return len(reader.tensors)


def test_stories260k_tensors(stories_path: Path) -> None:
    assert check_every_tensor(stories_path) > 0


def test_smollm2_tensors(smollm2_path: Path) -> None:
    assert check_every_tensor(smollm2_path) > 0
