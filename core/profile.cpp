#include "core/profile.h"

namespace autostage::core {

bool NodeProfile::operator==(const NodeProfile& o) const {
  return node == o.node && forwardSeconds == o.forwardSeconds &&
         backwardSeconds == o.backwardSeconds && outputBytes == o.outputBytes &&
         activationBytes == o.activationBytes && workingBytes == o.workingBytes &&
         paramBytes == o.paramBytes && maxBatch == o.maxBatch && failure == o.failure &&
         split == o.split;
}

bool CommProfile::operator==(const CommProfile& o) const {
  return p2pIntraNode == o.p2pIntraNode && p2pInterNode == o.p2pInterNode &&
         allreduceIntraNode == o.allreduceIntraNode && allreduceInterNode == o.allreduceInterNode &&
         allreduceGroups == o.allreduceGroups && measured == o.measured;
}

const LinkCost& CommProfile::allreduceWithinNode(int n) const {
  auto found = allreduceGroups.find(n);
  return found != allreduceGroups.end() ? found->second : allreduceIntraNode;
}

bool GraphProfile::operator==(const GraphProfile& o) const {
  return graphHash == o.graphHash && deviceKind == o.deviceKind && dtype == o.dtype &&
         estimated == o.estimated && calibration == o.calibration &&
         calibrationError == o.calibrationError && batchSizes == o.batchSizes && nodes == o.nodes &&
         comm == o.comm;
}

}  // namespace autostage::core
