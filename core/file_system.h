#pragma once
// Directory helpers on plain POSIX calls: create (mkdir -p), remove recursively (rm -rf), test.
//
// Note [No std::filesystem next to LibTorch wheels]
// The pip LibTorch wheels' libtorch_cpu.so exports its own, statically linked copy of
// libstdc++'s std::filesystem symbols (a known PyTorch packaging problem). A program linked with
// it can bind its own std::filesystem calls to that copy, built by another compiler with other
// internals: on the GPU machine (torch 2.11, GCC 13) std::filesystem::remove_all segfaulted in
// the event-trace tests. Code that runs in LibTorch-linked processes and walks or creates
// directories -- the runtime's trace files and the tests' scratch directories -- uses these
// functions instead. (The plan and profile caches' exists/create_directories calls ran fine
// there and stay as they are.)

#include <string>

namespace autostage::core {

// Creates directory `path` and its missing parents. Returns true when `path` is a directory
// afterwards; otherwise false, with the reason in `*error` when given.
bool createDirectories(const std::string& path, std::string* error = nullptr);

// Removes `path` and, for a directory, everything below it (symbolic links are removed, not
// followed). A missing path is not an error; anything that cannot be removed throws Error.
void removeAll(const std::string& path);

bool pathExists(const std::string& path);
bool isDirectory(const std::string& path);

// $TMPDIR when set, else /tmp.
std::string tempDirectory();

// `directory` + "/" + `name` (no separator doubled).
std::string joinPath(const std::string& directory, const std::string& name);

}  // namespace autostage::core
