# AUTOSTAGE_FUZZ=ON: instrument everything for libFuzzer (coverage) + ASan + UBSan and build the
# fuzz targets in tests/fuzz. Clang only: -fsanitize=fuzzer is a Clang feature.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "AUTOSTAGE_FUZZ=ON needs clang++ (libFuzzer), but the C++ compiler is "
    "${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}). Configure a separate build directory with "
    "-DCMAKE_CXX_COMPILER=clang++, or use scripts/fuzz, which does.")
endif()
set(AUTOSTAGE_FUZZ_SANITIZERS address,undefined)
# Libraries get coverage instrumentation without libFuzzer's main(); the targets link it.
add_compile_options(-fsanitize=fuzzer-no-link,${AUTOSTAGE_FUZZ_SANITIZERS}
                    -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(-fsanitize=${AUTOSTAGE_FUZZ_SANITIZERS})
