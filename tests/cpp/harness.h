// tests/cpp/harness.h: the one small harness every C++ test program shares — a registry of
// TEST cases, assertions that say file:line, expected and got, and a main() that runs every case.
// Header-only: CMake builds each tests/cpp/*.cpp as its own program, and that file includes this
// (once; it defines main).
//
//   #include "harness.h"
//
//   TEST(pool_allocate_release_refcounts) {              // registered in file order
//     BlockPool pool(4, 16);
//     CHECK(pool.allocate(3).has_value());               // fatal: ends the case, names the expression
//     CHECK_EQ(pool.n_allocatable(), 1);                 // fatal: got (left) vs expected (right)
//     CHECK_THROWS(InvalidArgument, BlockPool(0, 16), "blocks");  // E whose what() contains the text
//     EXPECT(err <= tol, cat("decode: error ", err));    // non-fatal: counted, the case goes on
//     FAIL("the engine did not go idle");                // fatal, with a message
//   }
//
// Output, one line per case: "ok    NAME" or "FAIL  NAME: why" (a failed EXPECT also prints
// "  file:line: what" first, at most 40 of them per case), then "N passed, M failed" counting
// cases; the exit status is 1 when any case failed. ember::test::args() holds the command-line
// arguments after the program name, ember::test::n_expects_passed() / n_expects_failed() the
// EXPECT counts of the running case. The pytest side (tests/cpp_cases.py) runs the program and
// checks that every case it expects reported "ok", so a case that silently disappears fails.
#pragma once

#include <cstdio>
#include <exception>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ember::test {

// What a fatal assertion throws; the runner reports its message.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Case {
  const char* name;
  void (*fn)();
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

inline std::vector<std::string>& args() {
  static std::vector<std::string> a;
  return a;
}

// EXPECT counts of the running case.
struct ExpectCounts {
  int passed = 0, failed = 0;
};
inline ExpectCounts& expect_counts() {
  static ExpectCounts counts;
  return counts;
}
inline int n_expects_passed() { return expect_counts().passed; }
inline int n_expects_failed() { return expect_counts().failed; }

// A value as the failure message shows it: streamed when it can be, else a placeholder.
template <typename T>
std::string show(const T& value) {
  if constexpr (requires(const T& v) { std::declval<std::ostream&>() << v; }) {
    std::ostringstream os;
    os << value;
    return os.str();
  } else {
    return "<value without operator<<>";
  }
}

inline std::string where(const char* file, int line) {
  std::string f = file;
  const size_t slash = f.find_last_of('/');
  return (slash == std::string::npos ? f : f.substr(slash + 1)) + ":" + std::to_string(line);
}

inline void expect(bool ok, const std::string& what, const char* file, int line) {
  ExpectCounts& counts = expect_counts();
  if (ok) {
    ++counts.passed;
    return;
  }
  if (++counts.failed <= 40) std::printf("  %s: %s\n", where(file, line).c_str(), what.c_str());
}

template <typename A, typename B>
void check_eq(const A& got, const B& expected, const char* got_text, const char* expected_text,
              const char* file, int line) {
  if (got == expected) return;
  throw Failure(where(file, line) + ": CHECK_EQ(" + got_text + ", " + expected_text + "): got " + show(got) +
                ", expected " + show(expected));
}

// Runs `body` and expects it to throw E with `needle` in what().
template <typename E, typename F>
void check_throws(F&& body, const std::string& needle, const char* type_text, const char* body_text,
                  const char* file, int line) {
  const std::string head = where(file, line) + ": CHECK_THROWS(" + body_text + "): ";
  try {
    body();
  } catch (const E& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      throw Failure(head + "expected a message containing '" + needle + "', got '" + e.what() + "'");
    }
    return;
  } catch (const std::exception& e) {
    throw Failure(head + "expected " + type_text + ", got another exception: '" + e.what() + "'");
  }
  throw Failure(head + "expected " + type_text + " containing '" + needle + "', got no exception");
}

// Runs every registered case in order; returns the exit status.
inline int run_all(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) args().emplace_back(argv[i]);
  int n_passed = 0, n_failed = 0;
  for (const Case& c : registry()) {
    expect_counts() = {};
    std::string why;
    try {
      c.fn();
      if (expect_counts().failed > 0) {
        why = std::to_string(expect_counts().failed) + " of " +
              std::to_string(expect_counts().passed + expect_counts().failed) + " EXPECTs failed";
      }
    } catch (const Failure& e) {
      why = e.what();
    } catch (const std::exception& e) {
      why = std::string("unexpected exception: ") + e.what();
    } catch (...) {
      why = "unexpected exception of an unknown type";
    }
    if (why.empty()) {
      ++n_passed;
      std::printf("ok    %s\n", c.name);
    } else {
      ++n_failed;
      std::printf("FAIL  %s: %s\n", c.name, why.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", n_passed, n_failed);
  return n_failed == 0 ? 0 : 1;
}

}  // namespace ember::test

#define TEST(name)                                                          \
  static void test_##name();                                                \
  static const ::ember::test::Register register_##name{#name, test_##name}; \
  static void test_##name()

#define CHECK(cond)                                                                                         \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      throw ::ember::test::Failure(::ember::test::where(__FILE__, __LINE__) + ": CHECK(" #cond ") failed"); \
    }                                                                                                       \
  } while (0)

#define CHECK_EQ(got, expected) \
  ::ember::test::check_eq((got), (expected), #got, #expected, __FILE__, __LINE__)

#define CHECK_THROWS(E, body, needle) \
  ::ember::test::check_throws<E>([&] { body; }, (needle), #E, #body, __FILE__, __LINE__)

#define EXPECT(cond, what) ::ember::test::expect(static_cast<bool>(cond), (what), __FILE__, __LINE__)

#define FAIL(what) throw ::ember::test::Failure(::ember::test::where(__FILE__, __LINE__) + ": " + (what))

int main(int argc, char** argv) { return ::ember::test::run_all(argc, argv); }
