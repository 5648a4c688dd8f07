# `cmake --install build --prefix P`: headers, libraries, the `autostage` CLI, the Python package
# and a CMake package, so that a project outside this tree uses
#   find_package(autostage REQUIRED)                       # autostage::autostage (C++ API)
#   find_package(autostage REQUIRED COMPONENTS planner)    # autostage::core, ::decomposer only
# The planner component needs neither LibTorch nor MPI; the runtime component (the default)
# needs the LibTorch and MPI this tree was built with (found again by autostageConfig.cmake).
include(CMakePackageConfigHelpers)

set(AUTOSTAGE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/autostage)
set(AUTOSTAGE_HEADER_DIR ${CMAKE_INSTALL_INCLUDEDIR}/autostage)

# Exported names: autostage::<name>.
set_target_properties(autostage_core PROPERTIES EXPORT_NAME core)
set_target_properties(autostage_decomposer PROPERTIES EXPORT_NAME decomposer)
set_target_properties(autostage_service PROPERTIES EXPORT_NAME service)
install(TARGETS autostage_core autostage_decomposer autostage_service EXPORT autostagePlannerTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT autostagePlannerTargets NAMESPACE autostage:: DESTINATION ${AUTOSTAGE_CMAKE_DIR})

# Headers of the layers a user's code includes, in this tree's layout (the API's headers include
# each other as "core/...", "staging/...").
set(AUTOSTAGE_HEADER_FOLDERS core core/ir core/proto decomposer service)
if(TARGET autostage_api)
  list(APPEND AUTOSTAGE_HEADER_FOLDERS frontend/torchscript frontend/export comm profiler staging driver bindings/cpp)
endif()
foreach(folder IN LISTS AUTOSTAGE_HEADER_FOLDERS)
  file(GLOB headers ${PROJECT_SOURCE_DIR}/${folder}/*.h)
  install(FILES ${headers} DESTINATION ${AUTOSTAGE_HEADER_DIR}/${folder})
endforeach()
install(DIRECTORY ${PROJECT_BINARY_DIR}/include/core/proto DESTINATION ${AUTOSTAGE_HEADER_DIR}/core
        FILES_MATCHING PATTERN "*.pb.h")
install(FILES ${PROJECT_BINARY_DIR}/include/autostage/build_config.h
        DESTINATION ${AUTOSTAGE_HEADER_DIR}/autostage)

if(TARGET autostage_api)
  set(runtime autostage_export autostage_torchscript autostage_comm autostage_profiler autostage_staging
      autostage_driver autostage_api)
  set_target_properties(autostage_export PROPERTIES EXPORT_NAME export)
  set_target_properties(autostage_torchscript PROPERTIES EXPORT_NAME torchscript)
  set_target_properties(autostage_comm PROPERTIES EXPORT_NAME comm)
  set_target_properties(autostage_profiler PROPERTIES EXPORT_NAME profiler)
  set_target_properties(autostage_staging PROPERTIES EXPORT_NAME staging)
  set_target_properties(autostage_driver PROPERTIES EXPORT_NAME driver)
  set_target_properties(autostage_api PROPERTIES EXPORT_NAME autostage)
  install(TARGETS ${runtime} EXPORT autostageRuntimeTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT autostageRuntimeTargets NAMESPACE autostage:: DESTINATION ${AUTOSTAGE_CMAKE_DIR})
  set(AUTOSTAGE_HAS_RUNTIME TRUE)
  # The Python package, importable with PYTHONPATH=P/lib/python3/dist-packages (or a .pth file).
  install(DIRECTORY ${PROJECT_BINARY_DIR}/python/autostage
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages
          PATTERN "__pycache__" EXCLUDE)
else()
  set(AUTOSTAGE_HAS_RUNTIME FALSE)
endif()
if(TARGET autostage)
  install(TARGETS autostage RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/autostageConfig.cmake.in
  ${PROJECT_BINARY_DIR}/autostageConfig.cmake INSTALL_DESTINATION ${AUTOSTAGE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/autostageConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/autostageConfig.cmake
              ${PROJECT_BINARY_DIR}/autostageConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/AutostageTorch.cmake  # used by the runtime component
        DESTINATION ${AUTOSTAGE_CMAKE_DIR})
