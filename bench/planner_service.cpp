// The planning service's latency (Note [Planning service]): for a synthetic model, side by side
// in one run, planning in the process, the first Plan call to a service on a Unix socket (it
// plans), Plan calls answered from its store (median and max of N), the same by profile key
// only (what a relaunched job sends), and a WhatIf sweep. Prints figures; never fails on time.
//
//   planner_service [SPEC] [DEVICES] [BATCH] [REPEATS]
//   planner_service bert:layers=96,hidden=2048,heads=32,seq=512 32 256 50
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/log.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"
#include "service/plan_call.h"
#include "service/planner_client.h"
#include "service/planner_server.h"

using namespace autostage;

namespace {

double seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "bert:layers=96,hidden=2048,heads=32,seq=512";
  const int devices = argc > 2 ? std::atoi(argv[2]) : 32;
  const int64_t batch = argc > 3 ? std::atoll(argv[3]) : 256;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 50;
  decomposer::SyntheticModel model = decomposer::syntheticFromSpec(spec, decomposer::DeviceModel());
  core::ClusterSpec cluster;
  cluster.devices = devices;
  cluster.devicesPerNode = std::min(devices, 8);
  cluster.memoryPerDevice = int64_t{40} << 30;
  decomposer::PlanOptions options;

  core::LogCapture quiet(/*echo=*/false);  // the partition logs are not the point here
  auto start = std::chrono::steady_clock::now();
  decomposer::planGraph(model.graph, model.profile, cluster, batch, options);
  const double local = seconds(start);

  const std::string listen = "unix:/tmp/autostage-bench-" + std::to_string(::getpid()) + ".sock";
  service::ServerOptions serverOptions;
  serverOptions.listen = listen;
  service::PlannerServer server(serverOptions);
  service::PlannerClient client(listen);
  proto::PlanCall call = service::makePlanCall(model.graph, model.profile, cluster, batch, options);
  call.set_profile_key("bench profile key");
  start = std::chrono::steady_clock::now();
  proto::PlanAnswer first = client.plan(call, 600);
  const double firstCall = seconds(start);

  std::vector<double> stored, byKey;
  proto::PlanCall keyOnly = call;
  keyOnly.clear_profile();
  for (int i = 0; i < repeats; ++i) {
    start = std::chrono::steady_clock::now();
    client.plan(call, 60);
    stored.push_back(seconds(start));
    start = std::chrono::steady_clock::now();
    client.plan(keyOnly, 60);
    byKey.push_back(seconds(start));
  }
  proto::WhatIfCall sweep;
  *sweep.mutable_base() = call;
  for (int n : {devices / 2, devices, devices * 2}) sweep.add_devices(std::max(1, n));
  for (double gib : {16.0, 40.0}) sweep.add_device_memory_gib(gib);
  for (const char* s : {"gpipe", "1f1b"}) sweep.add_schedules(s);
  start = std::chrono::steady_clock::now();
  proto::WhatIfAnswer whatIf = client.whatIf(sweep, 600);
  const double whatIfSeconds = seconds(start);

  std::printf("model %s (%d nodes, call %.2f MiB), %d devices x 40 GiB, batch %lld, %d stages\n",
              spec.c_str(), model.graph.nodeCount(), call.ByteSizeLong() / 1048576.0, devices,
              static_cast<long long>(batch), first.stages());
  std::printf("plan in this process            %9.3f ms\n", local * 1e3);
  std::printf("first Plan call (service plans) %9.3f ms\n", firstCall * 1e3);
  std::printf("Plan from the store, files sent %9.3f ms median, %.3f ms max (%d calls)\n",
              median(stored) * 1e3, *std::max_element(stored.begin(), stored.end()) * 1e3, repeats);
  std::printf("Plan from the store, key only   %9.3f ms median, %.3f ms max (%d calls)\n",
              median(byKey) * 1e3, *std::max_element(byKey.begin(), byKey.end()) * 1e3, repeats);
  std::printf("ratio local plan / stored answer (key only): %.0fx\n", local / median(byKey));
  std::printf("WhatIf of %d points                %9.3f ms\n", whatIf.points_size(),
              whatIfSeconds * 1e3);
  return 0;
}
