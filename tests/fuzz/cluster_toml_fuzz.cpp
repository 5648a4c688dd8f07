// libFuzzer target: see fuzz_loaders.cpp for what "cluster_toml" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("cluster_toml")
