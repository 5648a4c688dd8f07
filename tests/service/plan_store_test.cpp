// The planning service's store (Note [Planner store], Note [Store eviction]): least recently used
// entries evicted above the limit, the order and size kept across a reopen, damaged entries
// discarded, temporary files of writes a crash interrupted removed at open, and the versions
// that tell a copy kept in memory whether its entry changed (Note [Answers from memory]).
#include "service/plan_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/proto/file_format.h"
#include "scratch_files.h"

namespace autostage::service {
namespace {

std::string freshDirectory(const std::string& name) {
  std::filesystem::path d = testing::scratchPath("plan_store_tests", name);
  std::filesystem::remove_all(d);
  return d.string();
}

TEST_CASE("the store evicts the least recently used entries above its limit", "[service]") {
  for (bool onDisk : {true, false}) {
    INFO((onDisk ? "on disk" : "in memory"));
    PlanStore store(onDisk ? freshDirectory("lru") : "", 1000);
    const std::string bytes(300, 'x');
    store.put("plans", "a1", bytes);
    store.put("plans", "a2", bytes);
    store.put("plans", "a3", bytes);
    CHECK(store.bytes() == 900);
    CHECK(store.get("plans", "a1"));  // used: now the most recent but for a4 below
    store.put("plans", "a4", bytes);  // 1200 > 1000: down to 900 (90%), the oldest first
    CHECK(store.evictions() == 1);
    CHECK(store.bytes() == 900);
    CHECK(store.entries() == 3);
    CHECK_FALSE(store.get("plans", "a2"));
    CHECK(store.contains("plans", "a1"));
    CHECK(store.contains("plans", "a3"));
    CHECK(store.contains("plans", "a4"));
    // An entry above the limit on its own is kept (never the one just put); the others go.
    store.put("graphs", "b1", std::string(2000, 'y'));
    CHECK(store.entries() == 1);
    CHECK(store.get("graphs", "b1")->size() == 2000);
    CHECK(store.evictions() == 4);
  }
}

TEST_CASE("the store's size and use order survive a reopen", "[service]") {
  namespace fs = std::filesystem;
  const std::string dir = freshDirectory("reopen");
  {
    PlanStore store(dir, 0);  // no limit
    for (const char* key : {"c1", "c2", "c3"}) store.put("plans", key, std::string(300, 'x'));
    store.put("profile-keys", "c4", std::string(16, 'h'));
    CHECK(store.evictions() == 0);
  }
  // The last uses as the files' modification times say: c3 oldest, then c1, c4, c2.
  const auto now = fs::file_time_type::clock::now();
  int age = 4;
  for (const char* path :
       {"plans/c3.answer", "plans/c1.answer", "profile-keys/c4.key", "plans/c2.answer"})
    fs::last_write_time(fs::path(dir) / path, now - std::chrono::hours(age--));
  {
    PlanStore store(dir, 0);
    CHECK(store.bytes() == 916);
    CHECK(store.entries() == 4);
    // A use sets the modification time, so that the order survives the next reopen.
    REQUIRE(store.get("plans", "c3"));
    CHECK(fs::last_write_time(fs::path(dir) / "plans/c3.answer") > now - std::chrono::hours(1));
    fs::last_write_time(fs::path(dir) / "plans/c3.answer", now - std::chrono::hours(4));
  }
  // Reopened with a limit below its size: it evicts at once, the least recently used first.
  PlanStore store(dir, 500);  // down to 450 bytes: c3 and c1 go
  CHECK(store.evictions() == 2);
  CHECK(store.bytes() == 316);
  CHECK_FALSE(fs::exists(fs::path(dir) / "plans/c3.answer"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "plans/c1.answer"));
  CHECK(store.contains("plans", "c2"));
  CHECK(store.contains("profile-keys", "c4"));
}

TEST_CASE("temporary files of unfinished writes are removed at open once their writer is gone",
          "[service]") {
  namespace fs = std::filesystem;
  CHECK(core::atomicWriteTemporaryPid("ab12.answer.tmp-4321-7") == 4321);
  CHECK(core::atomicWriteTemporaryPid("ab12.answer") == -1);
  CHECK(core::atomicWriteTemporaryPid("ab12.answer.tmp-x-7") == -1);
  CHECK(core::atomicWriteTemporaryPid("ab12.answer.tmp-12-") == -1);
  const std::string dir = freshDirectory("temporaries");
  { PlanStore store(dir, 0); store.put("plans", "d1", "answer"); }
  // A writer that is gone: a child process that exited (and was reaped) left its pid free.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  const fs::path stale = fs::path(dir) / "plans" / ("d2.answer.tmp-" + std::to_string(child) + "-0");
  const fs::path live = fs::path(dir) / "plans" / ("d3.answer.tmp-" + std::to_string(::getpid()) + "-0");
  std::ofstream(stale) << "half an answer";
  std::ofstream(live) << "being written";
  PlanStore reopened(dir, 0);
  CHECK(reopened.removedTemporaries() == 1);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));  // its writer (this process) may still finish it
  CHECK(reopened.entries() == 1);
  CHECK(reopened.get("plans", "d1") == std::optional<std::string>("answer"));
}

TEST_CASE("a discarded entry is gone from the store and from its directory", "[service]") {
  namespace fs = std::filesystem;
  const std::string dir = freshDirectory("discard");
  PlanStore store(dir, 0);
  store.put("plans", "e1", "damaged bytes");
  store.discard("plans", "e1");
  CHECK_FALSE(store.contains("plans", "e1"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "plans" / "e1.answer"));
  CHECK(store.entries() == 0);
  CHECK(store.bytes() == 0);
  store.discard("plans", "e1");  // twice: nothing to do
  store.put("plans", "e1", "good bytes");
  CHECK(store.get("plans", "e1") == std::optional<std::string>("good bytes"));
}

TEST_CASE("an entry's version changes whenever the entry does, and only then", "[service]") {
  for (bool onDisk : {true, false}) {
    INFO((onDisk ? "on disk" : "in memory"));
    PlanStore store(onDisk ? freshDirectory("versions") : "", 1000);
    CHECK_FALSE(store.version("plans", "f1"));
    const auto first = store.put("plans", "f1", "answer one");
    REQUIRE(first);
    CHECK(store.version("plans", "f1") == first);  // uses do not change it
    uint64_t read = 0;
    CHECK(store.get("plans", "f1", &read) == std::optional<std::string>("answer one"));
    CHECK(read == *first);
    const auto second = store.put("plans", "f1", "answer two");  // put again: replaced
    REQUIRE(second);
    CHECK(*second != *first);
    CHECK(store.version("plans", "f1") == second);
    CHECK(store.get("plans", "f1", &read) == std::optional<std::string>("answer two"));
    CHECK(read == *second);
    CHECK(store.put("plans", "f2", "other") != second);  // never given twice
    store.discard("plans", "f1");
    CHECK_FALSE(store.version("plans", "f1"));
    const auto third = store.put("plans", "f1", "answer one");  // the same bytes again
    REQUIRE(third);
    CHECK(*third != *first);
    CHECK(*third != *second);
    store.put("plans", "f3", std::string(995, 'x'));  // above the limit: f2 and f1 evicted
    CHECK_FALSE(store.version("plans", "f1"));
    CHECK_FALSE(store.version("plans", "f2"));
  }
}

}  // namespace
}  // namespace autostage::service
