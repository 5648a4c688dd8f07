// libFuzzer target: see fuzz_loaders.cpp for what "graph_file" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("graph_file")
