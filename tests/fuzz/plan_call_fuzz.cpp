// libFuzzer target: see fuzz_loaders.cpp for what "plan_call" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("plan_call")
