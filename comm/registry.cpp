#include "comm/registry.h"

#include <map>
#include <mutex>

#include "autostage/build_config.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#if AUTOSTAGE_WITH_NCCL
#include "comm/nccl_backend.h"
#endif

namespace autostage::comm {

namespace {
struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, std::shared_ptr<Backend>> shared;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none (call comm::registerBuiltinBackends())" : out;
}

BackendFactory factoryOf(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(name);
  if (it != r.factories.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [known, factory] : r.factories) names.push_back(known);
  throw ConfigError("unknown comm backend '" + name + "'; known backends: " + joined(names));
}
}  // namespace

void registerBackend(const std::string& name, BackendFactory factory) {
  AUTOSTAGE_CHECK(factory, "registerBackend('", name, "'): the factory is empty");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

void registerBuiltinBackends() {
  registerBackend("mpi", [] { return std::make_shared<MpiBackend>(); });
#if AUTOSTAGE_WITH_NCCL
  registerBackend("nccl", [] {
    return std::make_shared<NcclBackend>(
        std::dynamic_pointer_cast<MpiBackend>(sharedBackend("mpi")));
  });
#endif
}

std::vector<std::string> knownBackends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

std::shared_ptr<Backend> createBackend(const std::string& name) { return factoryOf(name)(); }

std::shared_ptr<Backend> sharedBackend(const std::string& name) {
  BackendFactory factory = factoryOf(name);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.shared.find(name);
    if (it != r.shared.end()) return it->second;
  }
  // Created outside the lock: the NCCL factory itself asks for the shared MPI backend.
  std::shared_ptr<Backend> backend = factory();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.shared.emplace(name, std::move(backend)).first->second;
}

std::string backendNameFor(const at::Tensor& tensor) {
  AUTOSTAGE_CHECK(tensor.defined(), "backendFor: expected a defined tensor");
  switch (tensor.device().type()) {
    case c10::DeviceType::CPU:
      return "mpi";
    case c10::DeviceType::CUDA:
      // Without NCCL, MPI carries it through host memory (Note [CUDA tensors over MPI]).
      return AUTOSTAGE_WITH_NCCL ? "nccl" : "mpi";
    default:
      throw UnsupportedError("no comm backend for tensors on " + tensor.device().str() +
                             "; move the tensor to CPU (MPI) or CUDA (NCCL)");
  }
}

std::shared_ptr<Backend> backendFor(const at::Tensor& tensor) {
  return sharedBackend(backendNameFor(tensor));
}

}  // namespace autostage::comm
