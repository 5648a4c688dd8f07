# Included in CUDA builds only (CMakeLists.txt), after accuracy_serial.cmake: the GPU accuracy
# case times real blocks too.
set_tests_properties("profiler:accuracy: transformer encoder blocks on the GPU"
                     PROPERTIES RUN_SERIAL ON)
