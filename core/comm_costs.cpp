#include "core/comm_costs.h"

namespace autostage::core {

CommProfile configuredCommProfile(const Config& config) {
  LinkCost p2p{config.getFloat("comm_latency"), config.getFloat("comm_bandwidth")};
  LinkCost allreduce{config.getFloat("comm_latency"), config.getFloat("allreduce_bandwidth")};
  CommProfile profile;
  profile.p2pIntraNode = profile.p2pInterNode = p2p;
  profile.allreduceIntraNode = profile.allreduceInterNode = allreduce;
  profile.measured = false;
  return profile;
}

}  // namespace autostage::core
