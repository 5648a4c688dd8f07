// The planning service's latency (Note [Planning service]): for a synthetic model, side by side
// in one run, planning in the process, the first Plan call to a service on a Unix socket (it
// plans), Plan calls answered from its store (median and max of N), the same by profile key
// only (what a relaunched job sends), a WhatIf sweep, and a load of CLIENTS concurrent clients
// x CALLS calls each, mixed new and stored (by profile key, NEW global batch sizes coming in one
// after another: the first asks of each are planned, the rest come from the store), with p50/p99
// latency, throughput and the process's resident memory before and after. Prints figures; never
// fails on time.
//
//   planner_service [SPEC] [DEVICES] [BATCH] [REPEATS] [CLIENTS] [CALLS] [NEW]
//   planner_service bert:layers=96,hidden=2048,heads=32,seq=512 32 256 50 8 200 8
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/comm_costs.h"
#include "core/config.h"
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

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// This process's resident memory (VmRSS), MiB.
double residentMib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "bert:layers=96,hidden=2048,heads=32,seq=512";
  const int devices = argc > 2 ? std::atoi(argv[2]) : 32;
  const int64_t batch = argc > 3 ? std::atoll(argv[3]) : 256;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 50;
  const int clients = argc > 5 ? std::atoi(argv[5]) : 8;
  const int callsPerClient = argc > 6 ? std::atoi(argv[6]) : 200;
  const int newPlans = argc > 7 ? std::max(1, std::atoi(argv[7])) : 8;
  // A100-class devices (312 TFLOP/s, 40 GiB), 8 per node: what `autostage plan --synthetic`
  // assumes by default too.
  decomposer::DeviceModel device;
  device.peakFlops = 312e12;
  decomposer::SyntheticModel model = decomposer::syntheticFromSpec(spec, device);
  model.profile.comm = core::configuredCommProfile(core::globalConfig());  // as the CLI plans
  core::ClusterSpec cluster;
  cluster.devices = devices;
  cluster.devicesPerNode = std::min(devices, 8);
  cluster.memoryPerDevice = int64_t{40} << 30;
  cluster.peakFlops = device.peakFlops;
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

  // The load: every client asks by profile key (the service has the profile); a new batch size
  // comes in every callsPerClient / newPlans calls, so the first asks of each are planned (once:
  // the others wait for that plan) and the rest come from the store.
  const double rssBefore = residentMib();
  core::logger("Service")->set_level(spdlog::level::warn);  // one line per call otherwise
  // Per client: latencies of answers from the store, and of calls that waited for a new plan.
  std::vector<std::vector<double>> latencies(clients), planned(clients);
  std::atomic<int> failures{0};
  start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      service::PlannerClient mine(listen);
      proto::PlanCall ask = keyOnly;
      for (int i = 0; i < callsPerClient; ++i) {
        ask.set_batch_size(batch + 8 * (1 + int64_t{i} * newPlans / callsPerClient));
        auto t = std::chrono::steady_clock::now();
        try {
          const proto::PlanAnswer answer = mine.plan(ask, 600);
          const bool hit = answer.from_store() && !answer.joined_in_flight();
          (hit ? latencies : planned)[c].push_back(seconds(t));
        } catch (const Error&) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double loadSeconds = seconds(start);
  std::vector<double> all, waited;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  for (const auto& l : planned) waited.insert(waited.end(), l.begin(), l.end());
  const double rssAfter = residentMib();

  std::printf(
      "model %s (%zu nodes, call %.2f MiB), %d devices x 40 GiB at 312 TFLOP/s, batch %lld, "
      "%d stages\n",
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
  std::printf(
      "load: %d clients x %d calls, %d new plans: %zu from the store, %zu waited for a "
      "new plan, %d failed, %.1f s, %.0f calls/s\n",
      clients, callsPerClient, newPlans, all.size(), waited.size(), failures.load(), loadSeconds,
      (all.size() + waited.size()) / loadSeconds);
  if (!all.empty()) {
    std::printf("load, answers from the store    %9.3f ms p50, %.3f ms p99, %.3f ms max\n",
                percentile(all, 0.5) * 1e3, percentile(all, 0.99) * 1e3,
                *std::max_element(all.begin(), all.end()) * 1e3);
  }
  if (!waited.empty()) {
    std::printf("load, calls that waited for a new plan %9.3f ms p50, %.3f ms max\n",
                percentile(waited, 0.5) * 1e3,
                *std::max_element(waited.begin(), waited.end()) * 1e3);
  }
  std::printf(
      "resident memory (this process: service + clients) %.0f MiB before the load, %.0f MiB "
      "after\n",
      rssBefore, rssAfter);
  return 0;
}
