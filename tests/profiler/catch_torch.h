#pragma once
// Catch2 for test files that also include LibTorch: c10's glog defines a CHECK macro that
// aborts the process; including glog first and dropping its CHECK lets Catch's CHECK win.
// Include this instead of <catch2/catch.hpp>, before any torch header.

#include <c10/util/Logging.h>

#undef CHECK
#include <catch2/catch.hpp>
