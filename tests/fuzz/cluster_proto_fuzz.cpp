// libFuzzer target: see fuzz_loaders.cpp for what "cluster_proto" loads and checks.
#include "tests/fuzz/fuzz_loaders.h"

AUTOSTAGE_FUZZ_TARGET("cluster_proto")
