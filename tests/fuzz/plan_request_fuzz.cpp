// libFuzzer target: see fuzz_loaders.cpp for what "plan_request" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("plan_request")
