// load_model.h: how the bindings load a model (ember._core.Model, Embedder and Engine alike).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/model.h"

// `path` on `device` with n_threads CPU threads (unset: the physical cores). Call with the GIL
// released.
inline std::shared_ptr<ember::Model> load_model(const std::string& path, std::optional<int> n_threads,
                                                const std::string& device) {
  ember::ModelOptions options;
  options.n_threads = n_threads.value_or(0);
  options.backend = device;
  return ember::Model::load(path, options);
}
