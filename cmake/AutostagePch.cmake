# Precompiled LibTorch headers for the LibTorch-facing libraries (the tests have their own:
# autostage_torch_tests_pch in tests/CMakeLists.txt).
#
# Note [Library PCH]
# Most of a LibTorch-facing file's compile time is LibTorch's headers, not our code: measured on
# 2.11's, parsing <torch/csrc/jit/api/module.h> alone takes 7.7 s, <ATen/ATen.h> 11.9 s, of a
# file's 14-20 s; 25 files of staging/, driver/, frontend/torchscript/, profiler/ and
# bindings/python/ see the JIT's headers (most through frontend/torchscript/importer.h). Each such
# target precompiles the headers its files share once (a job of about their parse time) and its
# files load the result. A PCH is its own target's (no REUSE_FROM: the targets' flags differ,
# pybind11's module among them). Files of those targets that see none of those headers are left
# out (SKIP_PRECOMPILE_HEADERS): loading a PCH of hundreds of MB would cost them more than they
# parse. Building the LibTorch-facing libraries cold on the 2.x leg (2 cores, 2026-12-06): 309 s
# without, 253 s with. -DAUTOSTAGE_PCH=OFF builds without (to check that each file includes what
# it uses).

# autostage_torch_pch(<target> HEADERS <header...> [SKIP <source...>])
function(autostage_torch_pch target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "HEADERS;SKIP")
  if(NOT AUTOSTAGE_PCH)
    return()
  endif()
  target_precompile_headers(${target} PRIVATE ${arg_HEADERS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
  if(arg_SKIP)
    set_source_files_properties(${arg_SKIP} TARGET_DIRECTORY ${target}
      PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
