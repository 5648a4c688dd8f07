#pragma once
// AUTOSTAGE_MPI_CHECK: turns an MPI return code into a CommError. Internal to comm/ (includes
// <mpi.h>); MPI calls on our communicators return errors (MPI_ERRORS_RETURN) instead of aborting.

#include <string>

#include <mpi.h>

#include "core/error.h"

namespace autostage::comm::detail {
// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string mpiErrorText(int code);
}  // namespace autostage::comm::detail

// Usage: AUTOSTAGE_MPI_CHECK(MPI_Send(...), "send to rank ", dst);
#define AUTOSTAGE_MPI_CHECK(call, ...)                                                        \
  do {                                                                                        \
    int autostageMpiCode_ = (call);                                                           \
    if (autostageMpiCode_ != MPI_SUCCESS)                                                     \
      throw ::autostage::CommError(::autostage::detail::concat(                              \
          #call, " failed: ", ::autostage::comm::detail::mpiErrorText(autostageMpiCode_),     \
          " (", __VA_ARGS__, "). A peer may have died or the job is misconfigured; check "    \
          "the other ranks' logs"));                                                          \
  } while (false)
