// The planning service's latency (Note [Planning service], Note [Answers from memory]): for a
// synthetic model, side by side in one run, planning in the process, the first Plan call to a
// service on a Unix socket, its store in a directory under /tmp as `autostage serve --store`
// keeps it (the call plans), Plan calls answered from its store (median and max of REPEATS), the
// same by profile key only (what a relaunched job sends), where such a call's time goes (medians
// of its parts, each timed on its own in this process: the client encoding the call, the service
// decoding it, the planning core answering it, the answer's encoding and decoding; the rest of
// the round trip is transport and gRPC), a WhatIf sweep, then loads of answers from the store
// only, by profile key (1 client x CALLS calls, then CLIENTS concurrent clients x CALLS calls
// each: p50/p99 and this process's CPU per call side by side), and a mixed load of CLIENTS x
// CALLS (NEW global batch sizes coming in one after another: the first asks of each are planned,
// the rest come from the store), with p50/p99 latency, throughput and the process's resident
// memory before and after. The loads run with the service's per-call log line off (warn level);
// the single calls with it on. Prints figures; never fails on time.
//
//   planner_service [SPEC] [DEVICES] [BATCH] [REPEATS] [CLIENTS] [CALLS] [NEW]
//   planner_service bert:layers=96,hidden=2048,heads=32,seq=512 32 256 50 8 200 8
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
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

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}
double median(const std::vector<double>& v) { return percentile(v, 0.5); }
double maximum(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Seconds one run of `body` takes.
double timed(const std::function<void()>& body) {
  const auto start = Clock::now();
  body();
  return seconds(start);
}

// CPU seconds this process has used (user + system, every thread).
double cpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto toSeconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return toSeconds(usage.ru_utime) + toSeconds(usage.ru_stime);
}

// This process's resident memory (VmRSS), MiB.
double residentMib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}

// Latencies of `clients` concurrent clients asking `calls` calls each; `ask` makes call i of a
// client and says whether it was answered from the store without waiting for a plan.
struct Load {
  std::vector<double> stored, planned;  // answers from the store; calls that waited for a plan
  int failures = 0;
  double seconds = 0;
  double cpuSeconds = 0;  // this process's: the clients' and the service's
};
Load runLoad(const std::string& listen, int clients, int calls,
             const std::function<bool(service::PlannerClient&, int)>& ask) {
  std::vector<Load> each(clients);
  const auto start = Clock::now();
  const double cpuStart = cpuSeconds();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      service::PlannerClient mine(listen);
      for (int i = 0; i < calls; ++i) {
        const auto t = Clock::now();
        try {
          const bool hit = ask(mine, i);
          (hit ? each[c].stored : each[c].planned).push_back(seconds(t));
        } catch (const Error&) {
          ++each[c].failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Load all;
  all.seconds = seconds(start);
  all.cpuSeconds = cpuSeconds() - cpuStart;
  for (const Load& l : each) {
    all.stored.insert(all.stored.end(), l.stored.begin(), l.stored.end());
    all.planned.insert(all.planned.end(), l.planned.begin(), l.planned.end());
    all.failures += l.failures;
  }
  return all;
}

// A stored answer's round trip and its parts (see the comment at the top), medians of `repeats`.
void printSplit(service::PlannerServer& server, service::PlannerClient& client,
                const proto::PlanCall& call, int repeats) {
  std::vector<double> encode, decode, core, answerEncode, answerDecode, total;
  size_t callBytes = 0, answerBytes = 0;
  for (int i = 0; i < repeats; ++i) {
    std::string wire, answerWire;
    proto::PlanCall received;
    proto::PlanAnswer answer, back;
    encode.push_back(timed([&] { wire = call.SerializeAsString(); }));
    decode.push_back(timed([&] { received.ParseFromString(wire); }));
    core.push_back(timed([&] { answer = server.core().plan(received); }));
    answerEncode.push_back(timed([&] { answerWire = answer.SerializeAsString(); }));
    answerDecode.push_back(timed([&] { back.ParseFromString(answerWire); }));
    total.push_back(timed([&] { client.plan(call, 60); }));
    callBytes = wire.size();
    answerBytes = answerWire.size();
  }
  const double parts =
      median(encode) + median(decode) + median(core) + median(answerEncode) + median(answerDecode);
  std::printf("a stored answer by profile key, where its time goes (medians of %d):\n", repeats);
  std::printf("  client encodes the call (%.2f MiB)   %9.3f ms\n", callBytes / 1048576.0,
              median(encode) * 1e3);
  std::printf("  service decodes the call             %9.3f ms\n", median(decode) * 1e3);
  std::printf("  planning core answers (store lookup) %9.3f ms\n", median(core) * 1e3);
  std::printf("  service encodes the answer (%.2f MiB) %8.3f ms\n", answerBytes / 1048576.0,
              median(answerEncode) * 1e3);
  std::printf("  client decodes the answer            %9.3f ms\n", median(answerDecode) * 1e3);
  std::printf("  transport and gRPC (the rest)        %9.3f ms\n",
              std::max(0.0, median(total) - parts) * 1e3);
  std::printf("  round trip                           %9.3f ms\n", median(total) * 1e3);
}

void printLatencies(const char* what, const std::vector<double>& v) {
  std::printf("%s %9.3f ms p50, %.3f ms p99, %.3f ms max (%zu calls)\n", what,
              percentile(v, 0.5) * 1e3, percentile(v, 0.99) * 1e3, maximum(v) * 1e3, v.size());
}

// A load of answers from the store only: latencies, and CPU per call (clients and service).
void printStoredLoad(const char* what, const Load& load) {
  std::printf("%s %9.3f ms p50, %.3f ms p99, %.3f ms max, %.3f ms CPU per call (%zu calls)\n", what,
              percentile(load.stored, 0.5) * 1e3, percentile(load.stored, 0.99) * 1e3,
              maximum(load.stored) * 1e3,
              load.cpuSeconds / std::max<size_t>(1, load.stored.size()) * 1e3, load.stored.size());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "bert:layers=96,hidden=2048,heads=32,seq=512";
  const int devices = argc > 2 ? std::atoi(argv[2]) : 32;
  const int64_t batch = argc > 3 ? std::atoll(argv[3]) : 256;
  const int repeats = argc > 4 ? std::max(1, std::atoi(argv[4])) : 50;
  const int clients = argc > 5 ? std::max(1, std::atoi(argv[5])) : 8;
  const int callsPerClient = argc > 6 ? std::max(1, std::atoi(argv[6])) : 200;
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
  const double local =
      timed([&] { decomposer::planGraph(model.graph, model.profile, cluster, batch, options); });

  // The service keeps its store in a directory, as `autostage serve --store` does in production.
  const std::string scratch = "/tmp/autostage-bench-" + std::to_string(::getpid());
  const std::string listen = "unix:" + scratch + ".sock";
  service::ServerOptions serverOptions;
  serverOptions.listen = listen;
  serverOptions.storeDirectory = scratch + "-store";
  service::PlannerServer server(serverOptions);
  service::PlannerClient client(listen);
  proto::PlanCall call = service::makePlanCall(model.graph, model.profile, cluster, batch, options);
  call.set_profile_key("bench profile key");
  proto::PlanAnswer first;
  const double firstCall = timed([&] { first = client.plan(call, 600); });

  std::vector<double> stored, byKey;
  proto::PlanCall keyOnly = call;
  keyOnly.clear_profile();
  for (int i = 0; i < repeats; ++i) {
    stored.push_back(timed([&] { client.plan(call, 60); }));
    byKey.push_back(timed([&] { client.plan(keyOnly, 60); }));
  }
  std::printf(
      "model %s (%zu nodes, call %.2f MiB), %d devices x 40 GiB at 312 TFLOP/s, batch %lld, "
      "%d stages\n",
      spec.c_str(), model.graph.nodeCount(), call.ByteSizeLong() / 1048576.0, devices,
      static_cast<long long>(batch), first.stages());
  std::printf("plan in this process            %9.3f ms\n", local * 1e3);
  std::printf("first Plan call (service plans) %9.3f ms\n", firstCall * 1e3);
  std::printf("Plan from the store, files sent %9.3f ms median, %.3f ms max (%d calls)\n",
              median(stored) * 1e3, maximum(stored) * 1e3, repeats);
  std::printf("Plan from the store, key only   %9.3f ms median, %.3f ms max (%d calls)\n",
              median(byKey) * 1e3, maximum(byKey) * 1e3, repeats);
  std::printf("ratio local plan / stored answer (key only): %.0fx\n", local / median(byKey));
  printSplit(server, client, keyOnly, repeats);

  proto::WhatIfCall sweep;
  *sweep.mutable_base() = call;
  for (int n : {devices / 2, devices, devices * 2}) sweep.add_devices(std::max(1, n));
  for (double gib : {16.0, 40.0}) sweep.add_device_memory_gib(gib);
  for (const char* s : {"gpipe", "1f1b"}) sweep.add_schedules(s);
  proto::WhatIfAnswer whatIf;
  const double whatIfSeconds = timed([&] { whatIf = client.whatIf(sweep, 600); });
  std::printf("WhatIf of %d points                %9.3f ms\n", whatIf.points_size(),
              whatIfSeconds * 1e3);

  core::logger("Service")->set_level(spdlog::level::warn);  // one line per call otherwise
  // Answers from the store only: every client asks for the plan stored above, by profile key.
  auto askStored = [&](service::PlannerClient& mine, int) {
    return mine.plan(keyOnly, 60).from_store();
  };
  const Load alone = runLoad(listen, 1, callsPerClient, askStored);
  const Load together = runLoad(listen, clients, callsPerClient, askStored);
  std::printf("answers from the store only, by profile key (%d failed):\n",
              alone.failures + together.failures);
  printStoredLoad("  1 client  x", alone);
  std::printf("  %d clients x", clients);
  printStoredLoad("", together);

  // The mixed load: every client asks by profile key (the service has the profile); a new batch
  // size comes in every callsPerClient / newPlans calls, so the first asks of each are planned
  // (once: the others wait for that plan) and the rest come from the store.
  const double rssBefore = residentMib();
  const Load mixed = runLoad(listen, clients, callsPerClient, [&](auto& mine, int i) {
    proto::PlanCall ask = keyOnly;
    ask.set_batch_size(batch + 8 * (1 + int64_t{i} * newPlans / callsPerClient));
    const proto::PlanAnswer answer = mine.plan(ask, 600);
    return answer.from_store() && !answer.joined_in_flight();
  });
  const double rssAfter = residentMib();
  std::printf(
      "mixed load: %d clients x %d calls, %d new plans: %zu from the store, %zu waited for a "
      "new plan, %d failed, %.1f s, %.0f calls/s\n",
      clients, callsPerClient, newPlans, mixed.stored.size(), mixed.planned.size(), mixed.failures,
      mixed.seconds, (mixed.stored.size() + mixed.planned.size()) / mixed.seconds);
  if (!mixed.stored.empty()) printLatencies("  answers from the store        ", mixed.stored);
  if (!mixed.planned.empty()) printLatencies("  calls that waited for a plan  ", mixed.planned);
  std::printf(
      "resident memory (this process: service + clients) %.0f MiB before the mixed load, %.0f "
      "MiB after\n",
      rssBefore, rssAfter);
  server.shutdown();
  server.wait();
  std::filesystem::remove_all(serverOptions.storeDirectory);
  return 0;
}
