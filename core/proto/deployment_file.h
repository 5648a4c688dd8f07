#pragma once
// Deployment files: core::Deployment <-> proto::Deployment (deployment.proto) <-> framed bytes.
// Kind "deployment", version kDeploymentFormatVersion. The runtime broadcasts the encoded bytes,
// so encoding is deterministic (same deployment, same bytes).

#include <cstdint>
#include <string>

#include "core/deployment.h"
#include "core/proto/deployment.pb.h"

namespace autostage::core {

inline constexpr const char* kDeploymentFileKind = "deployment";
inline constexpr uint32_t kDeploymentFormatVersion = 1;

proto::Deployment toProto(const Deployment& deployment);
// Converts and runs checkDeployment.
Deployment fromProto(const proto::Deployment& message, const std::string& origin);

// Internal consistency: world_size >= 1, micro_batch_count >= 1; rank_hosts empty or one per
// rank (Note [Hosts of a deployment]); stage ids 0..n-1 in order; every stage has >= 1 rank, each
// in 0..world_size-1; no rank holds two stage replicas (in one stage or in two); every route's
// producer is the feeder or an existing stage and its consumers exist. Throws FormatError naming
// `origin` and the offending stage, rank, route or field.
void checkDeployment(const Deployment& deployment, const std::string& origin);

std::string encodeDeployment(const Deployment& deployment);
Deployment decodeDeployment(const std::string& bytes,
                            const std::string& origin = "deployment bytes");

void saveDeployment(const Deployment& deployment, const std::string& path);
Deployment loadDeployment(const std::string& path);

// What a saved deployment must match to be reused by a job.
struct DeploymentKey {
  std::string graphHash;
  int worldSize = 1;
  int64_t deviceMemory = 0;
  int64_t batchSize = 0;
};

// "" when `saved` was planned for `wanted`; otherwise one message naming every differing field
// with both values, e.g. "deployment was planned for world_size=8, this job has 4".
std::string describeMismatch(const Deployment& saved, const DeploymentKey& wanted);

}  // namespace autostage::core
