#pragma once
// One bind function per layer, called from module.cpp. Bindings only convert; no logic here.

#include <pybind11/pybind11.h>

namespace autostage::bindings {

// Version and the exception classes (autostage.Error and its subclasses).
void bindCore(pybind11::module_& m);
// IR import from a ScriptModule, IR object, exported subgraphs.
void bindTorchscript(pybind11::module_& m);
void bindExport(pybind11::module_& m);  // the torch.export front end's IR builder
// autostage.Module's C++ side, get_rank/get_world_size/barrier, options.
void bindStaging(pybind11::module_& m);

}  // namespace autostage::bindings
