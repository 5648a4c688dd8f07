#pragma once
// Error classes and the checking macros every layer uses.
//
// Contract: library code never aborts or exits; it throws one of these. Messages say what was
// expected, what came, and what to do. Bindings map each class once to a Python exception.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace autostage {

// Base of every autostage error. `what()` carries the full message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class ConfigError : public Error { using Error::Error; };       // bad option value or type
class FormatError : public Error { using Error::Error; };       // bad, truncated or wrong-version file
class UnsupportedError : public Error { using Error::Error; };  // construct autostage cannot handle
class PlanError : public Error { using Error::Error; };         // no feasible plan, bad plan request
class CommError : public Error { using Error::Error; };         // communication failure or timeout
class InternalError : public Error { using Error::Error; };     // a bug in autostage

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace autostage

// Throws `ErrorClass` with the streamed message parts when `cond` is false.
#define AUTOSTAGE_CHECK_AS(ErrorClass, cond, ...)                    \
  do {                                                               \
    if (!(cond)) throw ErrorClass(::autostage::detail::concat(__VA_ARGS__)); \
  } while (false)

// Bad input or configuration from the user.
#define AUTOSTAGE_CHECK(cond, ...) AUTOSTAGE_CHECK_AS(::autostage::Error, cond, __VA_ARGS__)

// Something autostage itself got wrong; the message names the file and line.
#define AUTOSTAGE_INTERNAL_ASSERT(cond, ...)                                                  \
  AUTOSTAGE_CHECK_AS(::autostage::InternalError, cond, "internal error at ", __FILE__, ":", \
                     __LINE__, ": `", #cond, "` failed. ", ##__VA_ARGS__,                   \
                     " Please report this as an autostage bug.")
