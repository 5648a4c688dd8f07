# AUTOSTAGE_SANITIZE=ON (the `asan` preset): AddressSanitizer + UndefinedBehaviorSanitizer on every
# target we compile. Undefined behaviour stops the test (-fno-sanitize-recover) instead of printing
# and continuing, so ctest sees a failure. Libraries we link (LibTorch, protobuf, MPI) stay
# uninstrumented; see scripts/test-asan for what that means.
set(AUTOSTAGE_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
add_compile_options(${AUTOSTAGE_SANITIZE_FLAGS})
add_link_options(-fsanitize=address,undefined)
