// quant/no_contract.h: turns off floating-point contraction for the including file.
// The reference converters must reproduce gguf-py's numpy arithmetic bit for bit, and numpy rounds
// every float32 multiply and add separately: the quantizers' `trunc(x * id + 8.5f)` fused into one
// FMA (which GCC and Clang may emit when the target has FMA, e.g. with EMBER_NATIVE or on
// aarch64) would round once and can land on the other side of an integer (test_quant.py has such
// inputs). Include this only from .cpp files, after all other includes.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
