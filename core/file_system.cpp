#include "core/file_system.h"

#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace autostage::core {
namespace {

int removeEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

}  // namespace

bool createDirectories(const std::string& path, std::string* error) {
  // Each prefix ending before a '/', then the whole path; existing ones are fine.
  for (size_t slash = path.find('/', 1); ; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      if (error) *error = std::string(std::strerror(errno)) + " (creating '" + prefix + "')";
      return false;
    }
    if (slash == std::string::npos) break;
  }
  if (isDirectory(path)) return true;
  if (error) *error = "'" + path + "' exists and is not a directory";
  return false;
}

void removeAll(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return;  // nothing there
  // Depth first (children before their directory), not following symbolic links.
  AUTOSTAGE_CHECK(::nftw(path.c_str(), removeEntry, 16, FTW_DEPTH | FTW_PHYS) == 0,
                  "cannot remove '", path, "': ", std::strerror(errno),
                  "; check its permissions");
}

bool pathExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

bool isDirectory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string tempDirectory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

std::string joinPath(const std::string& directory, const std::string& name) {
  if (directory.empty()) return name;
  return directory.back() == '/' ? directory + name : directory + "/" + name;
}

}  // namespace autostage::core
