# AUTOSTAGE_SANITIZE=ON (the `asan` preset): AddressSanitizer + UndefinedBehaviorSanitizer on every
# target we compile. Undefined behaviour stops the test (-fno-sanitize-recover) instead of printing
# and continuing, so ctest sees a failure. Libraries we link (LibTorch, protobuf, MPI) stay
# uninstrumented; see scripts/test-asan for what that means.
set(AUTOSTAGE_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
add_compile_options(${AUTOSTAGE_SANITIZE_FLAGS})
add_link_options(-fsanitize=address,undefined)

# Called where the LibTorch-facing folders start (top-level CMakeLists.txt): UBSan's vptr check
# references the typeinfo of every polymorphic class whose members our code uses, and LibTorch does
# not export all of them (autostage_torchscript then fails to link: "undefined reference to
# `typeinfo for c10::DynamicType'"). So what is built from there on runs without -fsanitize=vptr;
# core/ and decomposer/ keep it. Every other UBSan check and ASan stay on.
function(autostage_sanitize_torch_facing)
  add_compile_options(-fno-sanitize=vptr)
endfunction()
