#include "core/config.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace autostage;
using namespace autostage::core;

TEST_CASE("defaults come from the option table", "[core]") {
  Config c;
  REQUIRE(c.getString("log_level") == "info");
  REQUIRE(c.getInt("max_blocks") == 256);
  REQUIRE(c.getFloat("mem_margin") == Approx(0.1));
  REQUIRE(c.origin("max_blocks") == "default");
  for (const auto& o : optionTable()) REQUIRE(c.toString().find(o.key + " = ") != std::string::npos);
}

TEST_CASE("any option reads back as text", "[core]") {
  Config c;
  c.set("partition_num", "4");
  c.set("schedule", "1f1b");
  c.set("log_all_ranks", "true");
  REQUIRE(c.text("partition_num") == "4");
  REQUIRE(c.text("schedule") == "\"1f1b\"");
  REQUIRE(c.text("log_all_ranks") == "true");
  REQUIRE(c.text("plan_cache_dir") == "\"\"");
  REQUIRE_THROWS_WITH(c.text("no_such_option"), Catch::Contains("unknown option 'no_such_option'"));
}

TEST_CASE("TOML file, then environment, then explicit set", "[core]") {
  Config c;
  c.applyToml("max_blocks = 64\nmem_margin = 1\nlog_all_ranks = true\n", "test.toml");
  REQUIRE(c.getInt("max_blocks") == 64);
  REQUIRE(c.getFloat("mem_margin") == 1.0);  // an integer is accepted for a float
  REQUIRE(c.getBool("log_all_ranks"));
  REQUIRE(c.origin("max_blocks") == "test.toml");
  c.applyEnvironment({{"AUTOSTAGE_MAX_BLOCKS", "32"}, {"PATH", "/bin"}});
  REQUIRE(c.getInt("max_blocks") == 32);
  REQUIRE(c.origin("max_blocks") == "env AUTOSTAGE_MAX_BLOCKS");
  c.set("max_blocks", "16");
  REQUIRE(c.getInt("max_blocks") == 16);
}

TEST_CASE("unknown keys warn, wrong types fail naming key, value and type", "[core]") {
  Config c;
  c.applyToml("no_such_key = 3\n", "f.toml");
  REQUIRE(c.warnings().size() == 1);
  REQUIRE_THAT(c.warnings()[0], Catch::Contains("no_such_key") && Catch::Contains("f.toml"));
  c.applyEnvironment({{"AUTOSTAGE_BOGUS", "1"}, {"AUTOSTAGE_CONF_DIR", "/tmp"}});
  REQUIRE(c.warnings().size() == 2);
  REQUIRE_THAT(c.warnings()[1], Catch::Contains("AUTOSTAGE_BOGUS"));

  REQUIRE_THROWS_AS(c.applyToml("max_blocks = \"many\"\n", "f.toml"), ConfigError);
  REQUIRE_THROWS_WITH(c.applyToml("max_blocks = \"many\"\n", "f.toml"),
                      Catch::Contains("max_blocks") && Catch::Contains("many") && Catch::Contains("int"));
  REQUIRE_THROWS_WITH(c.applyEnvironment({{"AUTOSTAGE_MEM_MARGIN", "lots"}}),
                      Catch::Contains("mem_margin") && Catch::Contains("lots") && Catch::Contains("float"));
  REQUIRE_THROWS_WITH(c.set("log_all_ranks", "maybe"), Catch::Contains("bool"));
  REQUIRE_THROWS_WITH(c.set("nope", "1"), Catch::Contains("unknown option 'nope'"));
  REQUIRE_THROWS_WITH(c.applyToml("max_blocks = [", "f.toml"), Catch::Contains("not valid TOML"));
  REQUIRE_THROWS_AS(c.applyToml("max_pipeline = 8\nmin_pipeline = \"x\"\n", "f.toml"), ConfigError);
  REQUIRE(c.getInt("max_blocks") == 256);  // failed loads changed nothing,
  REQUIRE(c.getInt("max_pipeline") == 0);  // not even the valid key before the bad one
}

TEST_CASE("markdown table lists every option", "[core]") {
  std::string md = optionTableMarkdown();
  for (const auto& o : optionTable()) REQUIRE(md.find("`" + o.key + "`") != std::string::npos);
}

TEST_CASE("RANNC_ variables set the options RaNNC and autostage share", "[core]") {
  Config c;
  c.applyEnvironment({{"RANNC_PARTITION_NUM", "2"},
                      {"RANNC_PIPELINE_NUM", "4"},
                      {"RANNC_MEM_LIMIT_GB", "1.5"},
                      {"RANNC_MEM_MARGIN", "0.2"},
                      {"RANNC_MIN_PIPELINE", "2"},
                      {"RANNC_MAX_PIPELINE", "8"},
                      {"RANNC_OPT_PARAM_FACTOR", "0"},
                      {"RANNC_SAVE_DEPLOYMENT", "true"},
                      {"RANNC_DEPLOYMENT_FILE", "/tmp/d.deployment"},
                      {"RANNC_PARTITIONING_DRY_RUN_NP", "8"},
                      {"RANNC_CHECKPOINTING", "true"}});
  REQUIRE(c.getInt("partition_num") == 2);
  REQUIRE(c.origin("partition_num") == "env RANNC_PARTITION_NUM");
  REQUIRE(c.getInt("pipeline_num") == 4);
  REQUIRE(c.getFloat("mem_limit_gb") == 1.5);
  REQUIRE(c.getFloat("mem_margin") == Approx(0.2));
  REQUIRE(c.getInt("min_pipeline") == 2);
  REQUIRE(c.getInt("max_pipeline") == 8);
  REQUIRE(c.getFloat("opt_param_factor") == 0.0);
  REQUIRE(c.getBool("save_deployment"));
  REQUIRE(c.getString("deployment_file") == "/tmp/d.deployment");
  REQUIRE(c.getInt("partitioning_dry_run_np") == 8);
  REQUIRE(c.getString("recompute") == "always");  // RaNNC's checkpointing
  REQUIRE(c.origin("recompute") == "env RANNC_CHECKPOINTING");
  REQUIRE(c.warnings().empty());
  c.applyEnvironment({{"RANNC_CHECKPOINTING", "false"}});
  REQUIRE(c.getString("recompute") == "never");
}

TEST_CASE("AUTOSTAGE_ variables win over RANNC_ ones", "[core]") {
  Config c;
  c.applyEnvironment({{"RANNC_PARTITION_NUM", "2"}, {"AUTOSTAGE_PARTITION_NUM", "3"},
                      {"RANNC_CHECKPOINTING", "true"}, {"AUTOSTAGE_RECOMPUTE", "auto"}});
  REQUIRE(c.getInt("partition_num") == 3);
  REQUIRE(c.origin("partition_num") == "env AUTOSTAGE_PARTITION_NUM");
  REQUIRE(c.getString("recompute") == "auto");
  REQUIRE(c.origin("recompute") == "env AUTOSTAGE_RECOMPUTE");
}

TEST_CASE("RANNC_ variables autostage lacks warn - bad values fail naming the variable", "[core]") {
  Config c;
  c.applyEnvironment({{"RANNC_REPLICA_NUM", "2"}, {"RANNC_NO_SUCH_THING", "1"},
                      {"RANNC_CONF_DIR", "/tmp"}, {"RANNCX", "1"}});
  REQUIRE(c.warnings().size() == 3);
  std::string all = c.warnings()[0] + c.warnings()[1] + c.warnings()[2];
  REQUIRE_THAT(all, Catch::Contains("RANNC_REPLICA_NUM has no autostage equivalent"));
  REQUIRE_THAT(all,
               Catch::Contains("RANNC_NO_SUCH_THING") && Catch::Contains("not a RaNNC option"));
  REQUIRE_THAT(all, Catch::Contains("RANNC_CONF_DIR is ignored"));
  REQUIRE_THROWS_WITH(c.applyEnvironment({{"RANNC_PARTITION_NUM", "two"}}),
                      Catch::Contains("partition_num") &&
                          Catch::Contains("env RANNC_PARTITION_NUM") && Catch::Contains("two"));
  REQUIRE_THROWS_WITH(c.applyEnvironment({{"RANNC_CHECKPOINTING", "maybe"}}),
                      Catch::Contains("RANNC_CHECKPOINTING") && Catch::Contains("maybe"));
  REQUIRE(c.getInt("partition_num") == 0);
}
