// The dependency table of docs/architecture.md, checked on the sources: each folder includes only
// the folders below it, so the flow is one-way (driver/ decides, staging/ runs, nothing calls back
// up), and core/, decomposer/ and service/ stay free of LibTorch, MPI and CUDA: all of core/, with
// no exception since the TorchScript front end moved to frontend/torchscript/.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "scratch_files.h"

namespace {

namespace fs = std::filesystem;

// The folder a project include names: "frontend/torchscript/x.h" -> "frontend/torchscript",
// "bindings/cpp/module.h" -> "bindings/cpp", "core/ir/graph.h" -> "core".
std::string folderOf(const std::string& include) {
  for (const char* nested :
       {"frontend/torchscript/", "frontend/export/", "bindings/cpp/", "bindings/cli/",
        "bindings/python/"})
    if (include.rfind(nested, 0) == 0) return std::string(nested).substr(0, strlen(nested) - 1);
  return include.substr(0, include.find('/'));
}

// What each folder may include (besides itself); "autostage" is the generated build_config.h.
const std::map<std::string, std::set<std::string>> kAllowed = {
    {"core", {"autostage"}},
    {"frontend/torchscript", {"core", "frontend/export"}},  // exportSubgraph runs export graphs
    {"frontend/export", {"core"}},
    {"decomposer", {"core"}},
    {"service", {"core", "decomposer"}},
    {"comm", {"autostage", "core"}},
    {"profiler", {"autostage", "core", "frontend/torchscript", "comm"}},
    // decomposer: the tensor-parallel patterns and their split (tensor_parallel_split.h), which
    // the planner and the rewrite share; frontend/export: the operator names of export graphs.
    {"staging", {"core", "frontend/torchscript", "frontend/export", "comm", "decomposer"}},
    {"driver",
     {"autostage", "core", "frontend/torchscript", "frontend/export", "comm", "profiler",
      "decomposer", "service", "staging"}},
};
const std::set<std::string> kTorchFree = {"core", "decomposer", "service"};

struct Violation {
  std::string file, line;
};

// Every offending #include line of the sources under `source`/`folder`; counts the files read.
std::vector<Violation> violations(const fs::path& source, const std::string& folder,
                                  int* files = nullptr) {
  const fs::path root = source / folder;
  const std::regex project("^\\s*#include \"([a-z_]+/[^\"]+)\"");
  const std::regex system("^\\s*#include <(torch|ATen|c10|mpi|nccl|cuda)[/.>_]");
  const std::set<std::string>& allowed = kAllowed.at(folder);
  std::vector<Violation> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const fs::path& path = entry.path();
    if (path.extension() != ".h" && path.extension() != ".cpp") continue;
    const std::string relative = fs::relative(path, source).string();
    if (files) ++*files;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::smatch match;
      if (std::regex_search(line, match, project)) {
        const std::string target = folderOf(match[1]);
        if (target != folder && !allowed.count(target)) found.push_back({relative, line});
      } else if (kTorchFree.count(folder) && std::regex_search(line, system)) {
        found.push_back({relative, line});
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("each folder includes only the folders below it (docs/architecture.md)", "[core]") {
  for (const auto& [folder, allowed] : kAllowed) {
    int files = 0;
    for (const Violation& v : violations(AUTOSTAGE_SOURCE_DIR, folder, &files)) {
      INFO(v.file << ": " << v.line);
      FAIL_CHECK(folder << " may not include this");
    }
    INFO(folder);
    CHECK(files >= (folder == "frontend/export" ? 2 : 4));  // the folder's sources were read
  }
}

TEST_CASE("the layering check refuses an include going up, and torch in a torch-free folder",
          "[core]") {
  const fs::path source = autostage::testing::scratchPath("layering", "tree");
  fs::remove_all(source);
  auto write = [&](const std::string& file, const std::string& text) {
    fs::create_directories((source / file).parent_path());
    std::ofstream(source / file) << text;
  };
  write("staging/executor.cpp",
        "#include \"staging/executor.h\"\n#include \"core/ir/graph.h\"\n"
        "#include \"frontend/torchscript/importer.h\"\n");
  write("staging/callback.cpp", "#include \"driver/module.h\"\n");
  write("decomposer/plan.cpp", "#include <ATen/ATen.h>\n#include \"core/config.h\"\n");
  write("core/ir/graph.cpp", "#include \"core/ir/graph.h\"\n");
  write("core/torch/import.cpp", "#include <torch/script.h>\n");  // core/ is torch-free, all of it
  std::vector<Violation> core = violations(source, "core");
  REQUIRE(core.size() == 1);
  CHECK(core[0].file == "core/torch/import.cpp");
  std::vector<Violation> staging = violations(source, "staging");
  REQUIRE(staging.size() == 1);
  CHECK(staging[0].file == "staging/callback.cpp");
  std::vector<Violation> decomposer = violations(source, "decomposer");
  REQUIRE(decomposer.size() == 1);
  CHECK(decomposer[0].line == "#include <ATen/ATen.h>");
  fs::remove_all(source);
}
