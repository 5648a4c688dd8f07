# Finding LibTorch, for Debian's 1.13 (under /usr) and a pip wheel's 2.x (site-packages/torch)
# alike. Included by the top-level CMakeLists.txt in place of a bare find_package(Torch), and
# installed with the CMake package, whose runtime component includes it the same way (after
# spdlog and protobuf are found: it needs fmt::fmt and Protobuf_INCLUDE_DIR).

# Note [A LibTorch beside Debian's]
# TorchConfig finds its libraries with find_library(torch ... PATHS <its prefix>/lib), which
# searches the system's folders first: a wheel's LibTorch (given as Torch_DIR or through
# torch.utils.cmake_prefix_path) on a machine that also has Debian's libtorch-dev 1.13 gets
# /usr/lib/.../libtorch.so -- 2.x headers linked against 1.13 libraries; its
# find_package(Caffe2 PATHS <beside it>) likewise takes Debian's Caffe2 package (torch_cpu).
# Giving the wheel's root as CMAKE_PREFIX_PATH is no cure: its include/ has protobuf headers,
# which find_package(Protobuf) then takes. So with Torch_DIR set, Caffe2_DIR is set beside it and the libraries TorchConfig
# looks up by name are looked up first, in that LibTorch's lib/ only (cached results are what
# TorchConfig then uses); and whatever the caller gave, a library that is not the found
# package's own is refused.
#
# Note [Headers LibTorch bundles]
# A wheel's include folder carries its own copies of fmt (12.x) and protobuf (3.13) headers, and
# as an -isystem folder it is searched before /usr/include. spdlog 1.10 (Debian's, built against
# fmt 9) and our generated .pb.h files (protoc 3.21) then compile against the wrong versions. So
# the fmt and protobuf headers we link against are put first: a folder of links to them, added
# BEFORE every other system include folder of the targets defined after this file.
if(Torch_DIR AND EXISTS "${Torch_DIR}/../../../lib")
  if(NOT Caffe2_DIR AND EXISTS "${Torch_DIR}/../Caffe2")
    get_filename_component(Caffe2_DIR "${Torch_DIR}/../Caffe2" ABSOLUTE CACHE)
  endif()
  get_filename_component(_autostage_torch_lib "${Torch_DIR}/../../../lib" ABSOLUTE)
  foreach(pair "TORCH_LIBRARY|torch" "c10_LIBRARY|c10" "C10_CUDA_LIBRARY|c10_cuda")
    string(REPLACE "|" ";" pair "${pair}")
    list(GET pair 0 variable)
    list(GET pair 1 name)
    find_library(${variable} ${name} PATHS "${_autostage_torch_lib}" NO_DEFAULT_PATH)
  endforeach()
endif()
find_package(Torch REQUIRED)

get_target_property(_autostage_torch_cpu torch_cpu LOCATION)
foreach(library TORCH_LIBRARY c10_LIBRARY _autostage_torch_cpu)
  if(${library} AND NOT "${${library}}" MATCHES "^${TORCH_INSTALL_PREFIX}/")
    message(FATAL_ERROR "LibTorch at ${TORCH_INSTALL_PREFIX}, but ${library} is ${${library}} "
      "(another installation's). Configure a new build folder with -DTorch_DIR=<that "
      "LibTorch>/share/cmake/Torch (Note [A LibTorch beside Debian's], "
      "cmake/AutostageTorch.cmake).")
  endif()
endforeach()

set(_autostage_first "${PROJECT_BINARY_DIR}/include-before-torch")
set(_autostage_shadowed "")
get_target_property(_autostage_fmt_dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
foreach(pair "fmt|${_autostage_fmt_dirs}" "google|${Protobuf_INCLUDE_DIR}")
  string(REPLACE "|" ";" pair "${pair}")
  list(POP_FRONT pair name)
  foreach(torch_dir ${TORCH_INCLUDE_DIRS})
    foreach(own_dir ${pair})
      if(EXISTS "${torch_dir}/${name}" AND EXISTS "${own_dir}/${name}"
         AND NOT torch_dir STREQUAL own_dir)
        file(MAKE_DIRECTORY "${_autostage_first}")
        file(CREATE_LINK "${own_dir}/${name}" "${_autostage_first}/${name}" SYMBOLIC)
        list(APPEND _autostage_shadowed "${name} (${own_dir})")
      endif()
    endforeach()
  endforeach()
endforeach()
if(_autostage_shadowed)
  list(REMOVE_DUPLICATES _autostage_shadowed)
  message(STATUS "LibTorch bundles headers we take from elsewhere; first: ${_autostage_shadowed}")
  include_directories(BEFORE SYSTEM "${_autostage_first}")
endif()
