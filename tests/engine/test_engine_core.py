"""The model-independent engine core, one C++ program per layer, each driven without a model:
tests/cpp/test_block_pool.cpp, test_kv_cache_manager.cpp, test_disk_cache.cpp (the prefix cache's files),
test_scheduler.cpp, test_thread_pool.cpp
and test_engine.cpp (the scheduler's and engine's with the fake runner of tests/cpp/fake_runner.h).
This builds each program with CMake into tests/.cache/build-cpp (incrementally, so a second run
only links what changed), runs it, and checks that every case listed here reported "ok" and no other case ran.
"""

from __future__ import annotations

import pytest
from cpp_cases import build_cpp_test, run_cases

# Every case each program must run; a case that silently disappears fails its program's test.
PROGRAMS = {
    "test_block_pool": [
        "block_hash_is_chained_and_well_mixed",
        "pool_allocate_release_refcounts",
        "pool_prefix_cache_lookup_is_exact",
        "pool_hash_collisions_cannot_corrupt",
        "pool_evicts_least_recently_released_first",
        "pool_stale_parent_link_never_matches",
        "pool_partial_blocks_match_the_longest_common_prefix",
    ],
    "test_kv_cache_manager": [
        "manager_prefix_namespaces_never_share_blocks",
        "manager_prefix_hit_counts_full_blocks_and_never_the_whole_prompt",
        "manager_partial_hit_copies_the_rows_past_the_last_full_block",
        "copy_kv_copies_the_leading_rows_of_every_head",
        "manager_allocation_failure_changes_nothing",
        "manager_hit_on_evictable_blocks_counts_their_room",
        "manager_evicts_sequence_tails_first_and_older_sequences_first",
        "manager_releases_blocks_behind_the_window",
        "kv_budget_in_tokens_or_bytes",
        "paged_kv_cache_matches_a_contiguous_cache",
    ],
    "test_disk_cache": [
        "disk_cache_round_trips_blocks_by_hash",
        "disk_cache_ignores_truncated_corrupt_foreign_and_colliding_files",
        "disk_cache_bound_evicts_the_least_recently_used_files",
        "manager_serves_a_prompt_from_disk_after_a_restart",
        "state_file_round_trips_and_rejects_bad_files",
    ],
    "test_scheduler": [
        "scheduler_splits_the_token_budget",
        "scheduler_chunks_long_prompts_across_steps",
        "scheduler_never_splits_an_image_across_chunks",
        "scheduler_respects_parallel",
        "scheduler_prefix_hit_for_a_90_percent_shared_prompt",
        "scheduler_partial_block_hits_copy_rows_and_keep_outputs",
        "scheduler_partial_hit_without_room_for_its_source_runs_without_it",
        "scheduler_preempts_the_newest_and_resumes_with_identical_outputs",
        "scheduler_full_pool_makes_newcomers_wait",
        "scheduler_rejects_prompts_that_can_never_run",
        "scheduler_stops_on_stop_tokens_and_max_len",
        "scheduler_cancel_frees_blocks",
        "scheduler_priority_policy",
        "scheduler_without_prefix_caching_recomputes_everything",
        "scheduler_request_without_prefix_reuse_computes_its_whole_prompt",
        "scheduler_random_stress_against_reference",
        "scheduler_random_stress_with_drafts_against_reference",
        "scheduler_accepts_a_draft_prefix_and_rolls_back_the_rest",
    ],
    "test_speculation": [
        "ngram_drafts_copy_what_followed_the_latest_match",
        "prediction_requests_draft_from_their_own_text_where_the_prediction_is_lost",
        "prediction_cursor_follows_and_realigns_after_an_edit",
        "speculator_backs_off_when_steps_are_compute_bound",
        "speculator_counts_the_draft_models_cost",
        "draft_models_guesses_end_where_their_probability_stops_paying",
        "speculator_probes_a_draft_model_it_stopped_using",
        "draft_model_reads_a_prompt_when_its_prefill_completes",
        "engine_drafts_from_predictions_and_outputs_stay_exact",
    ],
    "test_thread_pool": [
        "pool_runs_every_part_exactly_once",
        "pool_runs_jobs_of_any_part_count",
        "pool_caller_takes_the_part_of_a_worker_that_is_not_running",
    ],
    "test_engine": [
        "engine_serves_submissions_from_many_threads",
        "engine_cancel_from_another_thread_frees_blocks",
        "engine_rejects_bad_requests_up_front",
        "engine_queue_holds_max_queue_beyond_the_slots_while_a_step_runs",
        "engine_runner_failure_fails_the_step_and_keeps_serving",
        "engine_shutdown_ends_every_stream",
    ],
}


@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_engine_core_layer(target: str) -> None:
    run_cases(build_cpp_test(target), PROGRAMS[target])
