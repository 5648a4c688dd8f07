#pragma once
// Small tensor helpers shared by the backends (checks, names, reduction arithmetic).

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>

namespace autostage::comm {

// `Float[2, 3]`: dtype and shape, for messages.
std::string describeTensor(const at::Tensor& tensor);

// Throws Error unless `tensor` is defined, contiguous, on `deviceType` and of a dtype the IR
// supports (float32/64, float16, bfloat16, int64/32/16/8, uint8, bool). `operation` names the
// call in the message.
void checkCommTensor(const at::Tensor& tensor, c10::DeviceType deviceType, const char* operation);
// The same, for a backend that takes tensors on any of `deviceTypes` (MPI: CPU, and CUDA through
// host memory: Note [CUDA tensors over MPI] in host_staging.h).
void checkCommTensor(const at::Tensor& tensor, std::initializer_list<c10::DeviceType> deviceTypes,
                     const char* operation);

// Throws Error unless `tensor` is floating point (Average of integers is not defined).
void checkAverageable(const at::Tensor& tensor);

// Bytes of the tensor's data.
int64_t tensorBytes(const at::Tensor& tensor);

// `into += other` elementwise for the comm dtypes (Bool: logical or).
void accumulate(const at::Tensor& into, const at::Tensor& other);

}  // namespace autostage::comm
