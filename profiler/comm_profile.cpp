#include "profiler/comm_profile.h"

#include <chrono>
#include <map>
#include <sstream>

#include <unistd.h>

#include <ATen/ops/zeros.h>

#include "core/comm_costs.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "profiler/cost_model.h"
#include "profiler/measurement_backend.h"

namespace autostage::profiler {
namespace {

constexpr int kTag = 7001;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string thisHost(const CommProfileOptions& options) {
  if (!options.hostName.empty()) return options.hostName;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

std::vector<int64_t> messageSizes(const CommProfileOptions& o) {
  std::vector<int64_t> sizes;
  for (int64_t s = o.minBytes; s <= o.maxBytes; s *= o.sizeFactor) sizes.push_back(s);
  return sizes;
}

at::Tensor buffer(int64_t bytes) { return at::zeros({std::max<int64_t>(1, bytes / 4)}); }

// Half the round trip of a ping-pong between `a` and `b`, per size (valid on rank `a`).
std::vector<double> pingPong(comm::Backend& backend, int a, int b,
                             const std::vector<int64_t>& sizes, int repeats) {
  std::vector<double> result;
  int me = backend.rank();
  for (int64_t size : sizes) {
    at::Tensor t = buffer(size);
    std::vector<double> times;
    for (int run = 0; run < repeats + 1; ++run) {
      double start = now();
      if (me == a) {
        backend.send(t, b, kTag);
        backend.recv(t, b, kTag);
      } else if (me == b) {
        backend.recv(t, a, kTag);
        backend.send(t, a, kTag);
      }
      if (run > 0) times.push_back((now() - start) / 2);
    }
    result.push_back(median(times));
  }
  return result;
}

// Allreduce time per size over `group` (valid on every member).
std::vector<double> allReduceTimes(comm::Backend& backend, const comm::Group& group,
                                   const std::vector<int64_t>& sizes, int repeats) {
  std::vector<double> result;
  for (int64_t size : sizes) {
    at::Tensor t = buffer(size);
    std::vector<double> times;
    for (int run = 0; run < repeats + 1; ++run) {
      backend.barrier(group);
      double start = now();
      backend.allReduce(t, comm::ReduceOp::Sum, group);
      if (run > 0) times.push_back(now() - start);
    }
    result.push_back(median(times));
  }
  return result;
}

// The root's link fit, shared with every rank through the control plane.
core::LinkCost shareFit(comm::Backend& backend, int root, const core::LinkCost& fit) {
  std::ostringstream out;
  out.precision(17);
  out << fit.latencySeconds << " " << fit.bytesPerSecond;
  std::string text = out.str();
  backend.broadcastBytes(text, root, backend.world());
  std::istringstream in(text);
  core::LinkCost shared;
  in >> shared.latencySeconds >> shared.bytesPerSecond;
  return shared;
}

struct Layout {
  std::vector<std::string> hosts;                // per rank
  int intraPeer = -1, interPeer = -1;            // of rank 0
  std::map<std::string, std::vector<int>> byHost;
};

Layout layoutOf(comm::Backend& backend, const CommProfileOptions& options) {
  Layout layout;
  layout.hosts = backend.allGatherBytes(thisHost(options), backend.world());
  for (int r = 0; r < static_cast<int>(layout.hosts.size()); ++r) {
    layout.byHost[layout.hosts[r]].push_back(r);
    bool same = layout.hosts[r] == layout.hosts[0];
    if (r > 0 && same && layout.intraPeer < 0) layout.intraPeer = r;
    if (!same && layout.interPeer < 0) layout.interPeer = r;
  }
  return layout;
}

std::vector<double> asDoubles(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

core::LinkCost measureP2p(comm::Backend& backend, int peer, const std::vector<int64_t>& sizes,
                          int repeats) {
  std::vector<double> times = pingPong(backend, 0, peer, sizes, repeats);
  core::LinkCost fit = backend.rank() == 0 ? fitLink(asDoubles(sizes), times) : core::LinkCost();
  backend.barrier(backend.world());
  return shareFit(backend, 0, fit);
}

// Bus-bandwidth fit: time = latency + 2(n-1)/n * bytes / bandwidth.
core::LinkCost measureAllReduce(comm::Backend& backend, const comm::Group& group, int root,
                                const std::vector<int64_t>& sizes, int repeats) {
  core::LinkCost fit;
  if (group.contains(backend.rank())) {
    std::vector<double> times = allReduceTimes(backend, group, sizes, repeats);
    double n = group.size();
    std::vector<double> busBytes;
    for (int64_t s : sizes) busBytes.push_back(2 * (n - 1) / n * static_cast<double>(s));
    fit = fitLink(busBytes, times);
  }
  return shareFit(backend, root, fit);
}

}  // namespace

void CommProfileOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, minBytes > 0 && maxBytes >= minBytes,
                     "comm profile sizes must satisfy 0 < minBytes <= maxBytes, got ", minBytes,
                     " and ", maxBytes);
  AUTOSTAGE_CHECK_AS(ConfigError, sizeFactor >= 2, "comm profile sizeFactor must be >= 2, got ",
                     sizeFactor);
  AUTOSTAGE_CHECK_AS(ConfigError, repeats >= 1, "comm profile repeats must be >= 1, got ",
                     repeats);
}

std::string CommProfileOptions::toString() const {
  std::ostringstream out;
  out << "sizes=" << minBytes << ".." << maxBytes << " x" << sizeFactor << " repeats=" << repeats
      << " host=" << (hostName.empty() ? "auto" : hostName);
  return out.str();
}

core::LinkCost fitLink(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  core::LinearCost line = fitLinear(bytes, seconds);
  core::LinkCost link;
  link.latencySeconds = line.fixed;
  link.bytesPerSecond = line.perSample > 0 ? 1 / line.perSample : 1e15;
  return link;
}

core::CommProfile configuredCommProfile() {
  return core::configuredCommProfile(core::globalConfig());
}

core::CommProfile profileComm(comm::Backend* backend, const CommProfileOptions& options) {
  options.validate();
  core::CommProfile profile = configuredCommProfile();
  if (!backend || backend->worldSize() < 2) {
    core::logger("Profiler")->info("one rank: using configured communication costs");
    return profile;
  }
  std::vector<int64_t> sizes = messageSizes(options);
  Layout layout = layoutOf(*backend, options);
  if (layout.intraPeer > 0)
    profile.p2pIntraNode = measureP2p(*backend, layout.intraPeer, sizes, options.repeats);
  if (layout.interPeer > 0)
    profile.p2pInterNode = measureP2p(*backend, layout.interPeer, sizes, options.repeats);
  // Allreduce across all ranks: inter-node when they span hosts. Intra-node: rank 0's host.
  core::LinkCost world = measureAllReduce(*backend, backend->world(), 0, sizes, options.repeats);
  (layout.byHost.size() > 1 ? profile.allreduceInterNode : profile.allreduceIntraNode) = world;
  const std::vector<int>& local = layout.byHost.at(layout.hosts[0]);
  if (layout.byHost.size() > 1 && local.size() > 1)
    profile.allreduceIntraNode =
        measureAllReduce(*backend, comm::Group(local), 0, sizes, options.repeats);
  // Tensor-parallel groups (Note [Tensor-parallel cost]): among the first n ranks of rank 0's
  // node, for n = 2, 4, 8 below its rank count (n = all of them is allreduceIntraNode).
  std::string groups;
  for (int n = 2; n <= 8 && n < static_cast<int>(local.size()); n *= 2) {
    const comm::Group group(std::vector<int>(local.begin(), local.begin() + n));
    const core::LinkCost link = measureAllReduce(*backend, group, 0, sizes, options.repeats);
    profile.allreduceGroups[n] = link;
    groups += fmt::format("; allreduce among {} ranks {:.1f} us + {:.2f} GB/s", n,
                          1e6 * link.latencySeconds, link.bytesPerSecond / 1e9);
  }
  profile.measured = true;
  core::logger("Profiler")->info(
      "comm profile over {} ranks on {} hosts: p2p intra {:.1f} us + {:.2f} GB/s, inter {:.1f} "
      "us + {:.2f} GB/s; allreduce intra {:.1f} us + {:.2f} GB/s, inter {:.1f} us + {:.2f} GB/s{} "
      "(unmeasured links keep configured values)", backend->worldSize(), layout.byHost.size(),
      1e6 * profile.p2pIntraNode.latencySeconds, profile.p2pIntraNode.bytesPerSecond / 1e9,
      1e6 * profile.p2pInterNode.latencySeconds, profile.p2pInterNode.bytesPerSecond / 1e9,
      1e6 * profile.allreduceIntraNode.latencySeconds,
      profile.allreduceIntraNode.bytesPerSecond / 1e9,
      1e6 * profile.allreduceInterNode.latencySeconds,
      profile.allreduceInterNode.bytesPerSecond / 1e9, groups);
  return profile;
}

}  // namespace autostage::profiler
