// core/error.h: the exception types the core throws; Python maps each to its own class.
// Errors are raised at the edges (file load, request validation), never from hot loops.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ember {

// Base of every error the core raises on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file (GGUF, tokenizer data) is malformed. Python: ember.GGUFError.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A caller passed a bad argument (shape, type name, token id). Python: ValueError.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A valid request for something this build does not implement (an architecture, a dtype op).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable values into one message: cat("tensor '", name, "': ", n, " bytes").
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace ember
