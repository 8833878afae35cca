"""llama.cpp through llama-cpp-python's low-level API, for the benchmarks that time it beside
ember (compare_llamacpp.py, engine_bench.py): one model, one context, a llama_batch of rows."""

from __future__ import annotations

import numpy as np


class LlamaCppContext:
    def __init__(self, path: str, n_threads: int, n_ctx: int, n_batch: int, n_ubatch: int,
                 n_seq_max: int = 1, quiet: bool = False) -> None:
        import llama_cpp as lc

        self.lc = lc
        if quiet:
            self._quiet = lc.llama_log_callback(lambda level, text, user_data: None)  # kept alive
            lc.llama_log_set(self._quiet, None)
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        # llama.cpp's extra buffer types (AMX / repacked weights) crash in ggml_backend_amx_mul_mat
        # on a 512-token decode with the llama-cpp-python 0.3.36 build here; its plain CPU
        # kernels are what we compare against.
        if hasattr(mparams, "use_extra_bufts"):
            mparams.use_extra_bufts = False
        load = getattr(lc, "llama_model_load_from_file", None) or lc.llama_load_model_from_file
        self.model = load(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_ubatch
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        new_ctx = getattr(lc, "llama_init_from_model", None) or lc.llama_new_context_with_model
        self.ctx = new_ctx(self.model, cparams)
        vocab = lc.llama_model_get_vocab(self.model) if hasattr(lc, "llama_model_get_vocab") else None
        self.n_vocab = lc.llama_vocab_n_tokens(vocab) if vocab is not None else lc.llama_n_vocab(self.model)
        self.batch = lc.llama_batch_init(n_batch, 0, n_seq_max)

    def clear(self) -> None:
        """Empties the KV cache of every sequence."""
        lc = self.lc
        if hasattr(lc, "llama_memory_clear"):
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        elif hasattr(lc, "llama_kv_self_clear"):
            lc.llama_kv_self_clear(self.ctx)
        else:
            lc.llama_kv_cache_clear(self.ctx)

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of rows (token, position, sequence, wants logits)."""
        b = self.batch
        b.n_tokens = len(rows)
        for i, (tok, pos, seq, out) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def logits(self, i: int) -> np.ndarray:
        """The logits of output row i (-1: the last), as a view."""
        ptr = self.lc.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
