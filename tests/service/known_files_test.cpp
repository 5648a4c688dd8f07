// The hashes of file bytes seen before (Note [Answers from memory]): found for exactly the same
// bytes of the same kind, never for bytes that differ anywhere (the fingerprint samples a large
// file; the match compares all of it), and kept within their bound.
#include "service/known_files.h"

#include <catch2/catch.hpp>
#include <string>

namespace autostage::service {
namespace {

std::string largeFile(char fill) {  // well above what the fingerprint reads of it
  std::string bytes(1 << 20, fill);
  for (size_t i = 0; i < bytes.size(); i += 97) bytes[i] = static_cast<char>(i % 251);
  return bytes;
}

TEST_CASE("a file's hash is found for exactly its bytes", "[service]") {
  KnownFiles known(int64_t{64} << 20);
  const std::string graph = largeFile('g');
  known.add("graph", graph, "0123456789abcdef");
  CHECK(known.find("graph", graph) == std::optional<std::string>("0123456789abcdef"));
  CHECK(known.find("graph", std::string(graph)) == std::optional<std::string>("0123456789abcdef"));
  CHECK_FALSE(known.find("profile", graph));  // another kind of file
  // One byte changed, where no sample of the fingerprint reads: the same candidate, not a match.
  std::string changed = graph;
  changed[changed.size() / 2 + 1001] ^= 0x01;
  CHECK_FALSE(known.find("graph", changed));
  CHECK_FALSE(known.find("graph", graph.substr(1)));
  // A small file, and the same bytes added again with another hash (the later one counts).
  known.add("profile", "small profile", "aa");
  known.add("profile", "small profile", "bb");
  CHECK(known.find("profile", "small profile") == std::optional<std::string>("bb"));
  CHECK(known.entries() == 2);
  CHECK(known.bytes() == static_cast<int64_t>(graph.size() + 13));
}

TEST_CASE("known files stay within their bound, the least recently matched going first",
          "[service]") {
  const std::string a = largeFile('a'), b = largeFile('b'), c = largeFile('c');
  KnownFiles known(static_cast<int64_t>(a.size()) * 2);
  known.add("graph", a, "aa");
  known.add("graph", b, "bb");
  CHECK(known.find("graph", a));  // matched: b is now the least recently matched
  known.add("graph", c, "cc");
  CHECK_FALSE(known.find("graph", b));
  CHECK(known.find("graph", a));
  CHECK(known.find("graph", c));
  CHECK(known.bytes() == static_cast<int64_t>(a.size()) * 2);
  KnownFiles tiny(16);  // a file larger than the bound is not kept
  tiny.add("graph", a, "aa");
  CHECK_FALSE(tiny.find("graph", a));
  CHECK(tiny.entries() == 0);
}

}  // namespace
}  // namespace autostage::service
