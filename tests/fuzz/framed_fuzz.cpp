// libFuzzer target: see fuzz_loaders.cpp for what "framed" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("framed")
