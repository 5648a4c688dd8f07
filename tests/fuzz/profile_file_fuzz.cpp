// libFuzzer target: see fuzz_loaders.cpp for what "profile_file" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("profile_file")
