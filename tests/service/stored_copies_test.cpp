// Copies of store entries kept in memory (Note [Answers from memory]): a copy is found only for
// the version it was decoded from, is replaced or dropped with its entry (read through a store:
// decoded once, decoded again when the entry is put again, gone when the entry is), and the
// copies stay within their bound, the least recently used going first.
#include "service/stored_copies.h"

#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <string>

namespace autostage::service {
namespace {

std::shared_ptr<const std::string> text(const std::string& s) {
  return std::make_shared<const std::string>(s);
}

TEST_CASE("a copy is found for the version it was decoded from, and only for it", "[service]") {
  StoredCopies<std::string> copies(1000);
  auto stored = text("answer of plan a1");
  copies.put("a1", 7, stored, 100);
  CHECK(copies.find("a1", 7) == stored);  // the very copy put, not another one
  CHECK(*copies.find("a1", 7) == "answer of plan a1");
  CHECK(copies.find("a1", 8) == nullptr);  // the entry was put again since: decode again
  CHECK(copies.find("a2", 7) == nullptr);
  // The entry replaced: its copy is replaced, the old one no longer found.
  copies.put("a1", 9, text("replanned"), 100);
  CHECK(copies.find("a1", 7) == nullptr);
  CHECK(*copies.find("a1", 9) == "replanned");
  CHECK(copies.entries() == 1);
  CHECK(copies.bytes() == 100);
  copies.erase("a1");  // the entry is gone from the store
  CHECK(copies.find("a1", 9) == nullptr);
  CHECK(copies.entries() == 0);
  CHECK(copies.bytes() == 0);
}

TEST_CASE("copies stay within their bound, the least recently used going first", "[service]") {
  StoredCopies<std::string> copies(1000);
  copies.put("b1", 1, text("1"), 400);
  copies.put("b2", 2, text("2"), 400);
  CHECK(copies.find("b1", 1));          // used: b2 is now the least recently used
  copies.put("b3", 3, text("3"), 400);  // 1200 > 1000: b2 goes
  CHECK(copies.find("b2", 2) == nullptr);
  CHECK(copies.find("b1", 1));
  CHECK(copies.find("b3", 3));
  CHECK(copies.bytes() == 800);
  // A copy larger than the bound on its own is not kept, and takes nothing else with it.
  copies.put("b4", 4, text("4"), 1001);
  CHECK(copies.find("b4", 4) == nullptr);
  CHECK(copies.entries() == 2);
  // The copy just put stays even when it alone fits.
  copies.put("b5", 5, text("5"), 1000);
  CHECK(copies.find("b5", 5));
  CHECK(copies.entries() == 1);
  CHECK(copies.bytes() == 1000);
  StoredCopies<std::string> none(0);  // a bound of 0 keeps nothing
  none.put("c1", 1, text("1"), 16);
  CHECK(none.find("c1", 1) == nullptr);
}

TEST_CASE("read decodes an entry once and again only when the store's entry changed", "[service]") {
  PlanStore store("", 0);  // in memory: the same versions as on disk
  StoredCopies<std::string> copies(1000);
  int decodes = 0;
  auto decode = [&](const std::string& bytes) {
    ++decodes;
    return std::make_shared<const std::string>("decoded " + bytes);
  };
  CHECK(copies.read(store, "plans", "d1", decode) == nullptr);  // not stored
  store.put("plans", "d1", "first answer");
  CHECK(*copies.read(store, "plans", "d1", decode) == "decoded first answer");
  CHECK(*copies.read(store, "plans", "d1", decode) == "decoded first answer");
  CHECK(decodes == 1);                           // the second came from memory
  store.put("plans", "d1", "replanned answer");  // replaced: never the old copy again
  CHECK(*copies.read(store, "plans", "d1", decode) == "decoded replanned answer");
  CHECK(decodes == 2);
  store.discard("plans", "d1");  // gone from the store: gone from memory
  CHECK(copies.read(store, "plans", "d1", decode) == nullptr);
  CHECK(copies.entries() == 0);
  // A decode that throws (a damaged entry) keeps nothing; the caller hears of it.
  store.put("plans", "d2", "damaged");
  auto refuse = [](const std::string&) -> std::shared_ptr<const std::string> {
    throw std::runtime_error("damaged");
  };
  CHECK_THROWS_AS(copies.read(store, "plans", "d2", refuse), std::runtime_error);
  CHECK(copies.entries() == 0);
}

}  // namespace
}  // namespace autostage::service
