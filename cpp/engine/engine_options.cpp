// engine/engine_options.cpp: the one check of the engine options' values (no model needed).
#include "engine/engine_options.h"

#include "core/error.h"

namespace ember {

namespace {

template <typename T>
void at_least(const char* name, T value, T low) {
  if (value < low) throw InvalidArgument(cat("[engine] ", name, " must be >= ", low, ", got ", value));
}

template <typename T>
void positive_if_set(const char* name, const std::optional<T>& value) {
  if (value && *value <= 0) throw InvalidArgument(cat("[engine] ", name, " must be > 0, got ", *value));
}

}  // namespace

void check_kv_type(const std::string& kv_type) {
  if (kv_type != "f16" && kv_type != "q8_0") {
    throw InvalidArgument(cat("[engine] kv_type must be 'f16' or 'q8_0', got '", kv_type, "'"));
  }
}

void EngineOptions::check() const {
  positive_if_set("n_ctx", n_ctx);
  at_least("parallel", parallel, 1);
  positive_if_set("kv_size", kv_size);
  positive_if_set("kv_bytes", kv_bytes);
  at_least("block_size", block_size, 1);
  at_least<int64_t>("max_batch_tokens", max_batch_tokens, 1);
  at_least<int64_t>("max_queue", max_queue, 0);
  at_least<int64_t>("cache_disk_bytes", cache_disk_bytes, 1);
  if (cache_dir && cache_dir->empty())
    throw InvalidArgument("[engine] cache_dir is empty (unset it for none)");
  positive_if_set("n_threads", n_threads);
  check_kv_type(kv_type);
  if (spec != "none" && spec != "ngram" && spec != "draft") {
    throw InvalidArgument(cat("[speculation] spec must be 'none', 'ngram' or 'draft', got '", spec, "'"));
  }
  if (spec == "draft" && !draft_model) {
    throw InvalidArgument("[speculation] spec 'draft' needs a draft model (draft_model)");
  }
  if (draft_model && spec == "ngram") {
    throw InvalidArgument(cat("[speculation] a draft model drafts only with spec 'draft', got '", spec, "'"));
  }
  if (draft_max < 1 || draft_min < 0 || draft_min > draft_max) {
    throw InvalidArgument(
        cat("[speculation] need 1 <= draft_max and 0 <= draft_min <= draft_max, got draft_max ", draft_max,
            ", draft_min ", draft_min));
  }
}

}  // namespace ember
