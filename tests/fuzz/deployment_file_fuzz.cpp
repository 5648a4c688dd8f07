// libFuzzer target: see fuzz_loaders.cpp for what "deployment_file" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("deployment_file")
