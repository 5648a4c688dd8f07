// The `_autostage` extension module; the public API is the `autostage` package around it.
#include "bindings/python/bindings.h"

PYBIND11_MODULE(_autostage, m) {
  m.doc() = "autostage C++ core (use the `autostage` package)";
  autostage::bindings::bindCore(m);
  autostage::bindings::bindTorchscript(m);
  autostage::bindings::bindExport(m);
  autostage::bindings::bindStaging(m);
}
