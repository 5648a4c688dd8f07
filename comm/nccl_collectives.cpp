// NcclBackend's collectives.
#include <ATen/ops/empty.h>

#include "comm/deadline.h"
#include "comm/nccl_backend.h"
#include "comm/nccl_impl.h"
#include "comm/tensor_util.h"

namespace autostage::comm {

namespace {
std::function<std::string()> membersText(const Group& group, const char* operation,
                                         const at::Tensor& tensor) {
  std::string text = "the other members of group " + group.toString() + " (" + operation + " of " +
                     describeTensor(tensor) + ")";
  return [text] { return text; };
}
}  // namespace

void NcclBackend::allReduce(const at::Tensor& tensor, ReduceOp op, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CUDA, "allReduce");
  checkMember(group, "allReduce");
  if (op == ReduceOp::Average) checkAverageable(tensor);
  if (group.size() == 1) return;
  // int16 has no NCCL type: reduce an int32 copy. Bool sums are a logical or: max over 0/1.
  bool widen = tensor.scalar_type() == at::kShort;
  at::Tensor work = widen ? tensor.to(at::kInt) : tensor;
  ncclRedOp_t ncclOp = work.scalar_type() == at::kBool ? ncclMax
                       : op == ReduceOp::Average       ? ncclAvg
                                                       : ncclSum;
  ncclComm_t comm = impl_->communicator(group);
  impl_->beforeCollective();
  AUTOSTAGE_NCCL_CHECK(ncclAllReduce(work.data_ptr(), work.data_ptr(), work.numel(),
                                     ncclTypeOf(work), ncclOp, comm, impl_->stream),
                       "rank ", rank(), " allReduce over group ", group.toString());
  cudaEvent_t done = impl_->recordDone();
  impl_->waitDone(done, comm, membersText(group, "allReduce", tensor));
  cudaEventDestroy(done);
  if (widen) tensor.copy_(work);
}

void NcclBackend::broadcast(const at::Tensor& tensor, int root, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CUDA, "broadcast");
  checkMember(group, "broadcast", root);
  if (group.size() == 1) return;
  ncclComm_t comm = impl_->communicator(group);
  impl_->beforeCollective();
  AUTOSTAGE_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                     ncclTypeOf(tensor), group.indexOf(root), comm, impl_->stream),
                       "rank ", rank(), " broadcast over group ", group.toString());
  cudaEvent_t done = impl_->recordDone();
  impl_->waitDone(done, comm, membersText(group, "broadcast", tensor));
  cudaEventDestroy(done);
}

std::vector<at::Tensor> NcclBackend::allGather(const at::Tensor& tensor, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CUDA, "allGather");
  checkMember(group, "allGather");
  std::vector<int64_t> shape = {group.size()};
  for (int64_t size : tensor.sizes()) shape.push_back(size);
  at::Tensor gathered = at::empty(shape, tensor.options());
  if (group.size() == 1) {
    gathered.select(0, 0).copy_(tensor);
  } else {
    ncclComm_t comm = impl_->communicator(group);
    impl_->beforeCollective();
    AUTOSTAGE_NCCL_CHECK(ncclAllGather(tensor.data_ptr(), gathered.data_ptr(), tensor.numel(),
                                       ncclTypeOf(tensor), comm, impl_->stream),
                         "rank ", rank(), " allGather over group ", group.toString());
    cudaEvent_t done = impl_->recordDone();
    impl_->waitDone(done, comm, membersText(group, "allGather", tensor));
    cudaEventDestroy(done);
  }
  std::vector<at::Tensor> out;
  for (int i = 0; i < group.size(); ++i) out.push_back(gathered.select(0, i));
  return out;
}

// Note [Sharded collectives]. int16 has no NCCL type: it travels as an int32 copy.
void NcclBackend::reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                const Group& group) {
  checkCommTensor(input, c10::DeviceType::CUDA, "reduceScatter");
  checkCommTensor(output, c10::DeviceType::CUDA, "reduceScatter");
  checkShards(input, output, group, "reduceScatter");
  if (op == ReduceOp::Average) checkAverageable(input);
  bool widen = input.scalar_type() == at::kShort;
  at::Tensor send = widen ? input.to(at::kInt) : input;
  at::Tensor receive = widen ? at::empty(output.sizes(), send.options()) : output;
  if (group.size() == 1) {
    receive.copy_(send.view(receive.sizes()));
  } else {
    ncclRedOp_t ncclOp = send.scalar_type() == at::kBool ? ncclMax
                         : op == ReduceOp::Average       ? ncclAvg
                                                         : ncclSum;
    ncclComm_t comm = impl_->communicator(group);
    impl_->beforeCollective();
    AUTOSTAGE_NCCL_CHECK(ncclReduceScatter(send.data_ptr(), receive.data_ptr(), receive.numel(),
                                           ncclTypeOf(send), ncclOp, comm, impl_->stream),
                         "rank ", rank(), " reduceScatter over group ", group.toString());
    cudaEvent_t done = impl_->recordDone();
    impl_->waitDone(done, comm, membersText(group, "reduceScatter", input));
    cudaEventDestroy(done);
  }
  if (widen) output.copy_(receive);
}

void NcclBackend::allGatherInto(const at::Tensor& input, const at::Tensor& output,
                                const Group& group) {
  checkCommTensor(input, c10::DeviceType::CUDA, "allGatherInto");
  checkCommTensor(output, c10::DeviceType::CUDA, "allGatherInto");
  checkShards(output, input, group, "allGatherInto");
  if (group.size() == 1) {
    output.view(-1).copy_(input.reshape(-1));
    return;
  }
  ncclComm_t comm = impl_->communicator(group);
  impl_->beforeCollective();
  AUTOSTAGE_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                     ncclTypeOf(input), comm, impl_->stream),
                       "rank ", rank(), " allGatherInto over group ", group.toString());
  cudaEvent_t done = impl_->recordDone();
  impl_->waitDone(done, comm, membersText(group, "allGatherInto", input));
  cudaEventDestroy(done);
}

// NCCL has no barrier: finish this rank's queued work, then meet over MPI.
void NcclBackend::barrier(const Group& group) {
  checkMember(group, "barrier");
  impl_->launchP2p();  // a peer may be waiting for a queued send
  AUTOSTAGE_CUDA_CHECK(cudaStreamSynchronize(impl_->stream), "rank ", rank(), " barrier");
  impl_->control->barrier(group);
}

void NcclBackend::createGroup(const Group& group) {
  checkMember(group, "createGroup");
  impl_->communicator(group);
}

}  // namespace autostage::comm
