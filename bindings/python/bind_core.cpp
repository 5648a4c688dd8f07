#include "bindings/python/bindings.h"
#include "core/error.h"

namespace autostage::bindings {

namespace py = pybind11;

void bindCore(py::module_& m) {
  m.attr("__version__") = AUTOSTAGE_VERSION;
  // pybind11 tries translators newest first, so subclasses registered after the base win.
  auto& base = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", base.ptr());
  py::register_exception<FormatError>(m, "FormatError", base.ptr());
  py::register_exception<UnsupportedError>(m, "UnsupportedError", base.ptr());
  py::register_exception<PlanError>(m, "PlanError", base.ptr());
  py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<InternalError>(m, "InternalError", base.ptr());
}

}  // namespace autostage::bindings
