#include "profiler/device_model.h"

#include "core/error.h"
#include "core/log.h"

namespace autostage::profiler {
namespace {

core::LinearCost scaled(const core::LinearCost& cost, double factor) {
  return {cost.fixed * factor, cost.perSample * factor};
}

}  // namespace

core::CommProfile commProfileOf(const core::ClusterSpec& spec) {
  core::CommProfile comm;
  comm.p2pIntraNode = {spec.latencySeconds, spec.intraNodeBandwidth};
  comm.p2pInterNode = {spec.latencySeconds, spec.interNodeBandwidth};
  comm.allreduceIntraNode = comm.p2pIntraNode;
  comm.allreduceInterNode = comm.p2pInterNode;
  comm.measured = false;
  return comm;
}

core::GraphProfile rescaleProfile(const core::GraphProfile& measured, double sourcePeakFlops,
                                  const core::ClusterSpec& target) {
  target.validate();
  AUTOSTAGE_CHECK_AS(ConfigError, sourcePeakFlops > 0,
                     "peak FLOP/s of the profiled device must be positive to rescale a profile, "
                     "got ", sourcePeakFlops, "; give the measuring device's peak FLOP/s");
  double factor = sourcePeakFlops / target.peakFlops;
  core::GraphProfile result = measured;
  for (core::NodeProfile& node : result.nodes) {
    node.forwardSeconds = scaled(node.forwardSeconds, factor);
    node.backwardSeconds = scaled(node.backwardSeconds, factor);
  }
  result.deviceKind = "estimated:" + target.deviceKind;
  result.estimated = true;
  result.comm = commProfileOf(target);
  core::logger("Profiler")->info("rescaled profile from {} to {} by FLOP ratio {:.4g} (estimated)",
                                 measured.deviceKind, target.deviceKind, factor);
  return result;
}

}  // namespace autostage::profiler
