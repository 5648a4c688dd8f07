#include "comm/mpi_environment.h"

#include <cstdlib>

#include "comm/mpi_check.h"
#include "core/log.h"

namespace autostage::comm {

namespace detail {
std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}
}  // namespace detail

namespace {
// Registered with atexit right after MPI_Init_thread, so it runs before the destructors of
// statics constructed earlier (e.g. a backend registry); those skip their MPI calls once
// finalized() is true.
void finalizeAtExit() {
  if (!MpiEnvironment::finalized()) MPI_Finalize();
}
}  // namespace

MpiEnvironment::MpiEnvironment() {
  int initialised = 0;
  AUTOSTAGE_MPI_CHECK(MPI_Initialized(&initialised), "checking whether MPI is initialised");
  AUTOSTAGE_CHECK_AS(CommError, !finalized(),
                     "MPI was already finalized in this process; autostage cannot use it again. "
                     "Finalize MPI only after the last autostage call");
  if (initialised) {
    AUTOSTAGE_MPI_CHECK(MPI_Query_thread(&threadLevel_), "querying the MPI thread level");
  } else {
    AUTOSTAGE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &threadLevel_),
                        "initialising MPI");
    initialisedHere_ = true;
    std::atexit(finalizeAtExit);
  }
  if (threadLevel_ < MPI_THREAD_MULTIPLE)
    core::logger("Comm")->warn(
        "MPI provides thread level {} below MPI_THREAD_MULTIPLE; call the MPI backend from one "
        "thread at a time", threadLevel_);
}

MpiEnvironment& MpiEnvironment::instance() {
  static MpiEnvironment environment;
  return environment;
}

bool MpiEnvironment::finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

void MpiEnvironment::abortJob(const std::string& message, int errorCode) {
  core::logger("Comm")->critical("aborting the job: {}", message);
  core::logger("Comm")->flush();
  if (!finalized()) MPI_Abort(MPI_COMM_WORLD, errorCode);
  throw CommError("MPI_Abort returned; the job could not be aborted. Original error: " + message);
}

}  // namespace autostage::comm
