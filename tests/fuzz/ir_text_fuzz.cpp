// libFuzzer target: see fuzz_loaders.cpp for what "ir_text" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("ir_text")
