// libFuzzer target: see fuzz_loaders.cpp for what "config_toml" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("config_toml")
