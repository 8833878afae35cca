"""The model-independent engine core (block pool, KV cache manager, scheduler, engine loop).

Its tests are C++ (tests/cpp/test_engine_core.cpp, driven by a fake runner); this builds that
program with CMake into tests/.cache/build-cpp (incrementally, so a second run only links
what changed), runs it, and checks every test case reported "ok".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import build_cpp_test

ROOT = Path(__file__).resolve().parent.parent
TARGET = "test_engine_core"

# Every case the program must run; a case that silently disappears fails this test.
EXPECTED_CASES = [
    "block_hash_is_chained_and_well_mixed",
    "pool_allocate_release_refcounts",
    "pool_prefix_cache_lookup_is_exact",
    "pool_hash_collisions_cannot_corrupt",
    "pool_evicts_least_recently_released_first",
    "pool_stale_parent_link_never_matches",
    "manager_prefix_hit_counts_full_blocks_and_never_the_whole_prompt",
    "manager_allocation_failure_changes_nothing",
    "manager_hit_on_evictable_blocks_counts_their_room",
    "manager_evicts_sequence_tails_first_and_older_sequences_first",
    "kv_budget_in_tokens_or_bytes",
    "scheduler_splits_the_token_budget",
    "scheduler_chunks_long_prompts_across_steps",
    "scheduler_respects_max_num_seqs",
    "scheduler_prefix_hit_for_a_90_percent_shared_prompt",
    "scheduler_preempts_the_newest_and_resumes_with_identical_outputs",
    "scheduler_full_pool_makes_newcomers_wait",
    "scheduler_rejects_prompts_that_can_never_run",
    "scheduler_stops_on_stop_tokens_and_max_len",
    "scheduler_cancel_frees_blocks",
    "scheduler_priority_policy",
    "scheduler_without_prefix_caching_recomputes_everything",
    "scheduler_random_stress_against_reference",
    "paged_kv_cache_matches_a_contiguous_cache",
    "engine_serves_submissions_from_many_threads",
    "engine_cancel_from_another_thread_frees_blocks",
    "engine_rejects_bad_requests_up_front",
    "engine_runner_failure_fails_the_step_and_keeps_serving",
    "engine_shutdown_ends_every_stream",
]


@pytest.fixture(scope="module")
def engine_core_binary() -> Path:
    return build_cpp_test(TARGET)


def test_engine_core_cases_pass(engine_core_binary: Path) -> None:
    proc = subprocess.run([str(engine_core_binary)], check=False, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    summary = re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert summary, f"no summary line in the output:\n{out}\n{proc.stderr}"
    n_passed, n_failed = int(summary.group(1)), int(summary.group(2))
    failures = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert n_failed == 0 and proc.returncode == 0, "\n".join(failures) or out
    ok = set(re.findall(r"^ok\s+(\S+)$", out, re.MULTILINE))
    missing = [case for case in EXPECTED_CASES if case not in ok]
    assert not missing, f"cases that did not report ok: {missing}"
    assert n_passed == len(ok) >= len(EXPECTED_CASES)
