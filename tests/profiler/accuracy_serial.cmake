# Included by CTest after the discovered profiler tests (named "profiler:" + test name): the
# accuracy tests time real blocks, so no other test may run beside them (accuracy_test.cpp).
foreach(name "MLP blocks" "transformer encoder blocks" "resnet18 blocks")
  set_tests_properties("profiler:accuracy: ${name}" PROPERTIES RUN_SERIAL ON)
endforeach()
