#pragma once
// The file loaders under fuzzing, by target name. Shared by the libFuzzer targets (one
// `<target>_fuzz.cpp` each) and by the plain corpus regression test (corpus_regression_test.cpp),
// so the normal build replays every committed corpus input through exactly the fuzzed code.
//
// Contract of every loader: bad input throws one of the library's user-facing errors
// (autostage::Error other than InternalError). Anything else is a finding: a crash, a sanitizer
// report, an InternalError, a foreign exception (std::out_of_range from std::stoi, ...), or a
// broken round trip on input that loaded (reported as FuzzFinding).

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace autostage::fuzz {

// Thrown when a loaded value breaks an invariant checked after loading (e.g. a round trip).
class FuzzFinding : public std::logic_error {
  using std::logic_error::logic_error;
};

// Feeds `bytes` to the loader named `target`; returns normally when the loader accepted the
// input or rejected it with a user-facing error. Throws std::invalid_argument for an unknown
// target.
void runLoader(const std::string& target, const std::string& bytes);

// Target names, e.g. "ir_text"; each has tests/fuzz/corpus/<name>/.
const std::vector<std::string>& loaderTargets();

// Turns logging off, ours and protobuf's (unknown config keys warn, invalid UTF-8 in a string
// field logs an error; a fuzzer would print millions of lines).
void quietLogging();

}  // namespace autostage::fuzz

// Defines LLVMFuzzerTestOneInput for one target (each <target>_fuzz.cpp holds just this line).
#define AUTOSTAGE_FUZZ_TARGET(name)                                                   \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                               \
    ::autostage::fuzz::quietLogging();                                                \
    return 0;                                                                         \
  }                                                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {          \
    ::autostage::fuzz::runLoader(name, std::string(reinterpret_cast<const char*>(data), size)); \
    return 0;                                                                         \
  }
