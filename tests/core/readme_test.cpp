// The options table of docs/options.md is generated from the option table; this keeps it true.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "core/config.h"

TEST_CASE("the options table of docs/options.md matches core/config.cpp", "[core]") {
  std::ifstream in(std::string(AUTOSTAGE_SOURCE_DIR) + "/docs/options.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  std::string readme = text.str();
  const std::string begin = "<!-- options-table:", end = "<!-- end options-table -->";
  size_t start = readme.find(begin), stop = readme.find(end);
  REQUIRE(start != std::string::npos);
  REQUIRE(stop != std::string::npos);
  start = readme.find('\n', start) + 1;
  INFO("docs/options.md is out of date: run scripts/update-readme");
  REQUIRE(readme.substr(start, stop - start) == autostage::core::optionTableMarkdown());
}
