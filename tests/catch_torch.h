#pragma once
// Catch2 for every test file that sees LibTorch, directly or through a project header: c10's
// logging defines a CHECK macro of its own (abort when false). Whichever definition came last
// won; where it was c10's (27 files until 2026-11-28), a passing CHECK was not counted and a
// failing one aborted the test binary instead of being reported. Including c10's logging here
// first (it is included once) and dropping its CHECK lets Catch's CHECK win, wherever this
// header comes among the includes. Include it instead of <catch2/catch.hpp>.

#include <c10/util/Logging.h>

#undef CHECK
#include <catch2/catch.hpp>
