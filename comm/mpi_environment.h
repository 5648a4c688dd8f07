#pragma once
// MPI's life cycle in this process: initialised once (MPI_THREAD_MULTIPLE when available) or
// adopted when the user already did (MPI_Initialized), and finalised at exit only if we
// initialised it, so mpirun never reports "exited improperly".

#include <string>

namespace autostage::comm {

class MpiEnvironment {
 public:
  // Initialises or adopts MPI; safe to call many times and from any thread.
  static MpiEnvironment& instance();

  bool initialisedHere() const { return initialisedHere_; }
  // MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE as provided.
  int threadLevel() const { return threadLevel_; }
  // True once MPI_Finalize has run (by us at exit or by the user); MPI calls are then invalid.
  static bool finalized();

  // Logs `message` as critical on the Comm logger and ends every rank with MPI_Abort. Throws
  // CommError only if MPI_Abort returns.
  [[noreturn]] static void abortJob(const std::string& message, int errorCode = 1);

 private:
  MpiEnvironment();
  bool initialisedHere_ = false;
  int threadLevel_ = 0;
};

}  // namespace autostage::comm
