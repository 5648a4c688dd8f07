// core/file_system: POSIX directory helpers (Note [No std::filesystem next to LibTorch wheels]).
#include "core/file_system.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "core/error.h"

using namespace autostage;

TEST_CASE("createDirectories, removeAll and the path tests", "[core]") {
  const std::string root =
      core::joinPath(core::tempDirectory(), "autostage_fs_test_" + std::to_string(::getpid()));
  core::removeAll(root);
  REQUIRE_FALSE(core::pathExists(root));

  const std::string deep = core::joinPath(root, "a/b/c");
  std::string error;
  REQUIRE(core::createDirectories(deep, &error));
  CHECK(error.empty());
  CHECK(core::isDirectory(deep));
  CHECK(core::createDirectories(deep + "/"));  // existing, trailing slash: fine
  std::ofstream(core::joinPath(deep, "file.txt")) << "x";
  std::ofstream(core::joinPath(root, "a/top.txt")) << "y";
  REQUIRE(::symlink(deep.c_str(), core::joinPath(root, "link").c_str()) == 0);

  // A regular file where a directory is asked for.
  const std::string file = core::joinPath(deep, "file.txt");
  CHECK(core::pathExists(file));
  CHECK_FALSE(core::isDirectory(file));
  CHECK_FALSE(core::createDirectories(file, &error));
  CHECK(error.find("not a directory") != std::string::npos);
  CHECK_FALSE(core::createDirectories(core::joinPath(file, "below"), &error));

  core::removeAll(root);  // the link goes, not what it points to (removed with the tree anyway)
  CHECK_FALSE(core::pathExists(root));
  CHECK_NOTHROW(core::removeAll(root));  // missing: nothing to do
}

TEST_CASE("joinPath and tempDirectory", "[core]") {
  CHECK(core::joinPath("/tmp", "x") == "/tmp/x");
  CHECK(core::joinPath("/tmp/", "x") == "/tmp/x");
  CHECK(core::joinPath("", "x") == "x");
  CHECK(core::isDirectory(core::tempDirectory()));
}
