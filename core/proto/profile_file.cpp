#include "core/proto/profile_file.h"

#include "core/error.h"
#include "core/proto/file_format.h"

namespace autostage::core {
namespace {

void linearToProto(const LinearCost& cost, proto::LinearCost* out) {
  out->set_fixed(cost.fixed);
  out->set_per_sample(cost.perSample);
}

LinearCost linearFromProto(const proto::LinearCost& message) {
  return {message.fixed(), message.per_sample()};
}

void linkToProto(const LinkCost& cost, proto::LinkCost* out) {
  out->set_latency_seconds(cost.latencySeconds);
  out->set_bytes_per_second(cost.bytesPerSecond);
}

LinkCost linkFromProto(const proto::LinkCost& message) {
  return {message.latency_seconds(), message.bytes_per_second()};
}

void nodeToProto(const NodeProfile& node, proto::NodeProfile* out) {
  out->set_node(node.node);
  linearToProto(node.forwardSeconds, out->mutable_forward_seconds());
  linearToProto(node.backwardSeconds, out->mutable_backward_seconds());
  linearToProto(node.outputBytes, out->mutable_output_bytes());
  linearToProto(node.activationBytes, out->mutable_activation_bytes());
  linearToProto(node.workingBytes, out->mutable_working_bytes());
  out->set_param_bytes(node.paramBytes);
  out->set_max_batch(node.maxBatch);
  out->set_failure(node.failure);
  for (const SplitTimes& split : node.split) {
    proto::SplitTimes* times = out->add_split();
    times->set_degree(split.degree);
    linearToProto(split.forwardSeconds, times->mutable_forward_seconds());
    linearToProto(split.backwardSeconds, times->mutable_backward_seconds());
  }
}

NodeProfile nodeFromProto(const proto::NodeProfile& message) {
  NodeProfile node;
  node.node = message.node();
  node.forwardSeconds = linearFromProto(message.forward_seconds());
  node.backwardSeconds = linearFromProto(message.backward_seconds());
  node.outputBytes = linearFromProto(message.output_bytes());
  node.activationBytes = linearFromProto(message.activation_bytes());
  node.workingBytes = linearFromProto(message.working_bytes());
  node.paramBytes = message.param_bytes();
  node.maxBatch = message.max_batch();
  node.failure = message.failure();
  for (const proto::SplitTimes& times : message.split())
    node.split.push_back({times.degree(), linearFromProto(times.forward_seconds()),
                          linearFromProto(times.backward_seconds())});
  return node;
}

void commToProto(const CommProfile& comm, proto::CommProfile* out) {
  linkToProto(comm.p2pIntraNode, out->mutable_p2p_intra_node());
  linkToProto(comm.p2pInterNode, out->mutable_p2p_inter_node());
  linkToProto(comm.allreduceIntraNode, out->mutable_allreduce_intra_node());
  linkToProto(comm.allreduceInterNode, out->mutable_allreduce_inter_node());
  for (const auto& [ranks, link] : comm.allreduceGroups) {
    proto::GroupLink* group = out->add_allreduce_groups();
    group->set_ranks(ranks);
    linkToProto(link, group->mutable_link());
  }
  out->set_measured(comm.measured);
}

CommProfile commFromProto(const proto::CommProfile& message) {
  CommProfile comm;
  comm.p2pIntraNode = linkFromProto(message.p2p_intra_node());
  comm.p2pInterNode = linkFromProto(message.p2p_inter_node());
  comm.allreduceIntraNode = linkFromProto(message.allreduce_intra_node());
  comm.allreduceInterNode = linkFromProto(message.allreduce_inter_node());
  for (const proto::GroupLink& group : message.allreduce_groups())
    comm.allreduceGroups[group.ranks()] = linkFromProto(group.link());
  comm.measured = message.measured();
  return comm;
}

std::string serialize(const GraphProfile& profile) {
  std::string payload;
  AUTOSTAGE_CHECK_AS(FormatError, toProto(profile).SerializeToString(&payload), "profile of graph ",
                     profile.graphHash, " cannot be serialized (over the 2 GiB protobuf limit)");
  return payload;
}

void addMismatch(std::string* out, const char* field, const std::string& expected,
                 const std::string& found) {
  if (expected == found) return;
  *out += std::string(out->empty() ? "" : "; ") + field + " is '" + found + "', expected '" +
          expected + "'";
}

}  // namespace

proto::GraphProfile toProto(const GraphProfile& profile) {
  proto::GraphProfile out;
  out.set_graph_hash(profile.graphHash);
  out.set_device_kind(profile.deviceKind);
  out.set_dtype(profile.dtype);
  out.set_estimated(profile.estimated);
  out.set_calibration(profile.calibration);
  out.set_calibration_error(profile.calibrationError);
  out.mutable_batch_sizes()->Add(profile.batchSizes.begin(), profile.batchSizes.end());
  for (const NodeProfile& node : profile.nodes) nodeToProto(node, out.add_nodes());
  commToProto(profile.comm, out.mutable_comm());
  return out;
}

GraphProfile fromProto(const proto::GraphProfile& message, const std::string& origin) {
  GraphProfile profile;
  profile.graphHash = message.graph_hash();
  profile.deviceKind = message.device_kind();
  profile.dtype = message.dtype();
  profile.estimated = message.estimated();
  profile.calibration = message.calibration();
  profile.calibrationError = message.calibration_error();
  profile.batchSizes.assign(message.batch_sizes().begin(), message.batch_sizes().end());
  for (int i = 0; i < message.nodes_size(); ++i) {
    NodeId id = message.nodes(i).node();
    if (id != i && id != kNoNode)
      throw FormatError(origin + ": profile entry " + std::to_string(i) + " is for node " +
                        std::to_string(id) + ", expected node " + std::to_string(i) +
                        " (entries are indexed by node id); delete the file and re-profile");
    profile.nodes.push_back(nodeFromProto(message.nodes(i)));
  }
  profile.comm = commFromProto(message.comm());
  return profile;
}

std::string encodeProfile(const GraphProfile& profile) {
  return encodeFramed(kProfileFileKind, kProfileFormatVersion, serialize(profile));
}

GraphProfile decodeProfile(const std::string& bytes, const std::string& origin) {
  FramedPayload framed = decodeFramed(bytes, kProfileFileKind, kProfileFormatVersion, origin);
  return fromProto(parsePayload<proto::GraphProfile>(framed, origin), origin);
}

void saveProfile(const GraphProfile& profile, const std::string& path) {
  writeFramedFile(path, kProfileFileKind, kProfileFormatVersion, serialize(profile));
}

GraphProfile loadProfile(const std::string& path) {
  std::string origin = "'" + path + "'";
  FramedPayload framed = readFramedFile(path, kProfileFileKind, kProfileFormatVersion);
  return fromProto(parsePayload<proto::GraphProfile>(framed, origin), origin);
}

GraphProfile loadProfileFor(const std::string& path, const std::string& graphHash,
                            const std::string& deviceKind, const std::string& dtype) {
  GraphProfile profile = loadProfile(path);
  std::string mismatch;
  addMismatch(&mismatch, "graph_hash", graphHash, profile.graphHash);
  addMismatch(&mismatch, "device_kind", deviceKind, profile.deviceKind);
  addMismatch(&mismatch, "dtype", dtype, profile.dtype);
  if (!mismatch.empty())
    throw FormatError("profile '" + path + "' belongs to another run: " + mismatch +
                      "; delete the cache file or re-profile for this graph, device and dtype");
  return profile;
}

}  // namespace autostage::core
