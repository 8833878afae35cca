"""Batched forward passes over several sequences of a paged KV cache (what the engine runs).

The test is C++ (tests/cpp/test_model_batch.cpp, on tests/cpp/harness.h): this builds it with
CMake into the same incremental build directory as the engine-core tests, runs it on stories260K
and checks that every case listed here reported "ok" and no other case ran.
"""

from __future__ import annotations

from pathlib import Path

from cpp_cases import build_cpp_test, run_cases

TARGET = "test_model_batch"
EXPECTED_CASES = ["batched_sequences_match_each_sequence_alone", "invalid_batches_are_refused",
                  "part_of_the_vocabulary_and_the_final_states",
                  "a_draft_model_scores_part_of_the_vocabulary_and_the_requests_own_tokens",
                  "staged_drafting_guesses_what_a_pass_per_guess_does",
                  "runner_rows_do_not_depend_on_the_batch", "runner_steps_never_allocate_matmul_scratch"]


def test_model_batch_cases_pass(stories_path: Path) -> None:
    run_cases(build_cpp_test(TARGET), EXPECTED_CASES, str(stories_path))
