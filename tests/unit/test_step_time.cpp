// The step-time model's parts (src/plan/): the communication model (measured points, fits,
// cluster files and their errors, hierarchical collectives), the weighted pipeline simulation
// against the unit-cost theory and a case worked by hand, the machine profile's file and
// interpolation, and predictions composed from known parts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_schedule.h"
#include "plan/comm_model.h"
#include "plan/layer_bench.h"
#include "plan/machine_profile.h"
#include "plan/step_time.h"
#include "strata/error.h"

using namespace strata;

namespace {

const char* kProfile = R"({"strata_comm_profile": 1, "source": "measured", "backend": "mpi",
  "ranks": 2, "nodes": 1, "ranks_per_node": 2,
  "fit": {"allreduce": {"intra": {"latency_s": 1e-5, "busbw_Bps": 1e9}},
          "sendrecv": {"intra": {"latency_s": 2e-6, "busbw_Bps": 4e9}}},
  "measurements": [
    {"op": "allreduce", "level": "intra", "ranks": 2, "bytes": 1024, "time_s": 2e-5, "algbw_Bps": 0, "busbw_Bps": 0},
    {"op": "allreduce", "level": "intra", "ranks": 2, "bytes": 2048, "time_s": 4e-5, "algbw_Bps": 0, "busbw_Bps": 0},
    {"op": "allreduce", "level": "intra", "ranks": 2, "bytes": 4096, "time_s": 5e-5, "algbw_Bps": 0, "busbw_Bps": 0}]})";

const char* kCluster = R"(name = "test"
ranks_per_node = 8
topology = "fat-tree"
[intra]
bandwidth_GBps = 400
latency_us = 2
[inter]
bandwidth_GBps = 50
latency_us = 5
)";

std::string without(std::string text, const std::string& line) {
  const size_t at = text.find(line);
  REQUIRE(at != std::string::npos);
  return text.erase(at, line.size());
}

}  // namespace

TEST_CASE("comm model: measured points are interpolated, the fit answers elsewhere", "[plan]") {
  const CommModel m = CommModel::from_profile_text(kProfile, "p.json");
  CHECK(m.seconds(CommOp::allreduce, 1024, 2, CommLevel::kIntra) == Approx(2e-5));
  CHECK(m.seconds(CommOp::allreduce, 1536, 2, CommLevel::kIntra) == Approx(3e-5));
  CHECK(m.seconds(CommOp::allreduce, 3072, 2, CommLevel::kIntra) == Approx(4.5e-5));
  // Beyond the measured sizes, or at another rank count: latency + bytes x 2(n-1)/n / busbw.
  CHECK(m.seconds(CommOp::allreduce, 1e6, 2, CommLevel::kIntra) == Approx(1e-5 + 1e6 * 1.0 / 1e9));
  CHECK(m.seconds(CommOp::allreduce, 2048, 4, CommLevel::kIntra) == Approx(1e-5 + 2048 * 1.5 / 1e9));
  CHECK(m.seconds(CommOp::sendrecv, 4e6, 2, CommLevel::kIntra) == Approx(2e-6 + 4e6 / 4e9));
  // An op the profile lacks borrows allreduce's link; a level it lacks, the other level's.
  CHECK(m.seconds(CommOp::all_gather, 1e6, 2, CommLevel::kIntra) == Approx(1e-5 + 0.5e6 / 1e9));
  CHECK(m.seconds(CommOp::allreduce, 1e6, 2, CommLevel::kInter) == Approx(1e-5 + 1e6 / 1e9));
  CHECK(m.seconds(CommOp::allreduce, 1e6, 1, CommLevel::kIntra) == 0);
  CHECK(CommModel().seconds(CommOp::allreduce, 1e6, 8, CommLevel::kInter) == 0);
  bool noted = false;
  for (const auto& a : m.assumptions()) noted = noted || a.find("no inter-node") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("comm model: a bad comm profile names the file and the key", "[plan]") {
  using Catch::Contains;
  std::string v2 = kProfile;
  v2.replace(v2.find("\"strata_comm_profile\": 1"), 24, "\"strata_comm_profile\": 2");
  CHECK_THROWS_WITH(CommModel::from_profile_text(v2, "p.json"),
                    Contains("p.json") && Contains("strata_comm_profile"));
  CHECK_THROWS_WITH(CommModel::from_profile_text(without(kProfile, ", \"busbw_Bps\": 1e9"), "p.json"),
                    Contains("p.json") && Contains("fit.allreduce.intra"));
  CHECK_THROWS_WITH(CommModel::from_profile_text("{\"strata_comm_profile\": 1}", "p.json"),
                    Contains("key \"fit\" missing"));
  CHECK_THROWS_WITH(CommModel::from_profile_text("{\"strata_comm_profile\": 1,", "p.json"),
                    Contains("p.json") && Contains("bad JSON"));
  std::string op = kProfile;
  op.replace(op.find("\"sendrecv\": {\"intra\""), 10, "\"alltoall\"");
  CHECK_THROWS_WITH(CommModel::from_profile_text(op, "p.json"), Contains("fit.alltoall"));
}

TEST_CASE("comm model: cluster files, hierarchical collectives across nodes", "[plan]") {
  const CommModel m = CommModel::from_cluster_text(kCluster, "c.toml");
  CHECK(m.ranks_per_node() == 8);
  CHECK(!m.device().present);
  // A link's latency counts once per step of a log2(n)-step collective.
  const double ar8 = m.seconds(CommOp::allreduce, 1e9, 8, CommLevel::kIntra);
  CHECK(ar8 == Approx(3 * 2e-6 + 1e9 * 1.75 / 400e9));
  // 16 ranks on 2 nodes: intra reduce-scatter, inter allreduce of 1/8 over 2 nodes, intra all-gather.
  const double rs = 3 * 2e-6 + 1e9 * 0.875 / 400e9, ag = rs;
  const double inter = 1 * 5e-6 + (1e9 / 8) * 1.0 / 50e9;
  CHECK(m.collective_seconds(CommOp::allreduce, 1e9, 16, 8) == Approx(rs + inter + ag));
  CHECK(m.collective_seconds(CommOp::allreduce, 1e9, 8, 8) == Approx(ar8));
  CHECK(m.collective_seconds(CommOp::sendrecv, 1e6, 2, 1) == Approx(5e-6 + 1e6 / 50e9));
  // The shipped H100 description reads, with its device.
  const CommModel h = CommModel::from_cluster(STRATA_SOURCE_DIR "/configs/clusters/h100-nvlink4-ndr400.toml");
  CHECK(h.ranks_per_node() == 8);
  CHECK(h.device().present);
  CHECK(h.fit(CommOp::allreduce, CommLevel::kInter).busbw_Bps == Approx(50e9));
  CHECK(h.fit(CommOp::allreduce, CommLevel::kIntra).busbw_Bps == Approx(450e9));
}

TEST_CASE("comm model: a bad cluster file names the file and the key", "[plan]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(CommModel::from_cluster_text(without(kCluster, "latency_us = 5\n"), "c.toml"),
                    Contains("c.toml") && Contains("\"inter.latency_us\" missing"));
  CHECK_THROWS_WITH(CommModel::from_cluster_text(without(kCluster, "ranks_per_node = 8\n"), "c.toml"),
                    Contains("c.toml") && Contains("\"ranks_per_node\" missing"));
  std::string topo = kCluster;
  topo.replace(topo.find("fat-tree"), 8, "torus");
  CHECK_THROWS_WITH(CommModel::from_cluster_text(topo, "c.toml"), Contains("c.toml:3") && Contains("topology"));
  CHECK_THROWS_WITH(CommModel::from_cluster_text(std::string(kCluster) + "[device]\nname = \"x\"\n", "c.toml"),
                    Contains("\"device.peak_tflops_bf16\" missing"));
  CHECK_THROWS_WITH(CommModel::from_cluster_text(std::string(kCluster) + "bogus = 1\n", "c.toml"),
                    Contains("unknown key \"inter.bogus\""));
  std::string neg = kCluster;
  neg.replace(neg.find("400"), 3, "-40");
  CHECK_THROWS_WITH(CommModel::from_cluster_text(neg, "c.toml"), Contains("intra.bandwidth_GBps"));
  CHECK_THROWS_WITH(CommModel::from_cluster_text("name = ", "c.toml"), Contains("c.toml:1") && Contains("TOML"));
}

TEST_CASE("schedule simulation: equal costs give the closed-form bubbles, costs scale", "[plan]") {
  struct Case { std::string kind; int P, M, v; double bubble; };
  for (const Case& c : {Case{"gpipe", 2, 4, 1, 1.0 / 5}, Case{"1f1b", 4, 8, 1, 3.0 / 11},
                        Case{"1f1b", 3, 5, 1, 2.0 / 7}, Case{"zb-h1", 4, 8, 1, 3.0 / 27},
                        Case{"interleaved", 2, 4, 2, -1}, Case{"interleaved", 4, 8, 3, -1}}) {
    INFO(c.kind << " P " << c.P << " M " << c.M << " v " << c.v);
    const double u = 1.0 / c.v;
    auto costs = [&](double k) {
      return std::vector<std::vector<OpCosts>>(size_t(c.P), std::vector<OpCosts>(size_t(c.v), OpCosts{k * u, 2 * k * u, k * u, k * u}));
    };
    const ScheduleSim one = simulate_schedule(c.kind, c.P, c.M, c.v, costs(1));
    if (c.bubble >= 0) CHECK(one.bubble() == Approx(c.bubble));
    // Interleaved: less than 1f1b's at the same P and M (the fill and drain shrink v times).
    else CHECK(one.bubble() < double(c.P - 1) / (c.M + c.P - 1));
    const ScheduleSim scaled = simulate_schedule(c.kind, c.P, c.M, c.v, costs(3.7));
    CHECK(scaled.span == Approx(3.7 * one.span));
    for (size_t s = 0; s < one.idle.size(); ++s) CHECK(scaled.idle[s] == Approx(one.idle[s]));
    CHECK(schedule_idle_shares(c.kind, c.P, c.M, c.v) == one.idle);
  }
}

TEST_CASE("schedule simulation: a 2-stage 1f1b case worked by hand", "[plan]") {
  // Stage 0: F 1, B 2; stage 1: F 2, B 3; a send takes 0.5. Stage 0 runs F0 F1 B0 B1, stage 1
  // F0 B0 F1 B1: s0 F0 [0,1] F1 [1,2]; s1 F0 [1.5,3.5] B0 [3.5,6.5] F1 [6.5,8.5] B1 [8.5,11.5];
  // s0 B0 waits for 6.5 + 0.5: [7,9], B1 for 11.5 + 0.5: [12,14].
  const std::vector<std::vector<OpCosts>> costs = {{OpCosts{1, 2, 0, 0}}, {OpCosts{2, 3, 0, 0}}};
  const ScheduleSim sim = simulate_schedule("1f1b", 2, 2, 1, costs, 0.5);
  CHECK(sim.span == Approx(14));
  CHECK(sim.finish[0] == Approx(14));
  CHECK(sim.finish[1] == Approx(11.5));
  CHECK(sim.busy[0] == Approx(6));
  CHECK(sim.busy[1] == Approx(10));
  CHECK(sim.idle[0] == Approx(8.0 / 14));
  CHECK(sim.idle[1] == Approx(4.0 / 14));
  // zb-h1 on the same stages with B 1 and W 1 on stage 0: its W's fill the wait.
  const std::vector<std::vector<OpCosts>> split = {{OpCosts{1, 2, 1, 1}}, {OpCosts{2, 3, 2, 1}}};
  CHECK(simulate_schedule("zb-h1", 2, 2, 1, split, 0.5).span < sim.span);
}

TEST_CASE("schedule simulation: stages sharing fewer cores than stages", "[plan]") {
  // The hand case above, no sends, both stages on one core: one of them can always run, so the
  // span is all the work, 6 + 10, whichever runs when.
  const std::vector<std::vector<OpCosts>> costs = {{OpCosts{1, 2, 0, 0}}, {OpCosts{2, 3, 0, 0}}};
  const ScheduleSim one_core = simulate_schedule("1f1b", 2, 2, 1, costs, 0, 1);
  CHECK(one_core.span == Approx(16));
  CHECK(one_core.busy[0] == Approx(6));
  CHECK(one_core.busy[1] == Approx(10));
  // A core each (capacity >= stages): the plain simulation.
  const ScheduleSim own = simulate_schedule("1f1b", 2, 2, 1, costs, 0.5, 2);
  CHECK(own.span == Approx(14));
  // P = 4 on 2 cores, unit costs: less than every op taking twice as long throughout (the old
  // model of oversubscription), at least the work over the 2 cores.
  for (const std::string kind : {"gpipe", "1f1b", "zb-h1"}) {
    INFO(kind);
    auto unit = [](double k) {
      return std::vector<std::vector<OpCosts>>(4, std::vector<OpCosts>(1, OpCosts{k, 2 * k, k, k}));
    };
    const ScheduleSim shared = simulate_schedule(kind, 4, 8, 1, unit(1), 0, 2);
    const ScheduleSim doubled = simulate_schedule(kind, 4, 8, 1, unit(2));
    double work = 0;
    for (double b : shared.busy) work += b;
    CHECK(shared.span < doubled.span);
    CHECK(shared.span >= work / 2 - 1e-9);
    CHECK(shared.idle.size() == 4);
  }
}

namespace {

MachineProfile mlp_profile(const PlannedModel& m) {
  MachineProfile p;
  p.device = "cpu";
  p.cores = 2;
  p.threads = 1;
  p.checkpoint_write_Bps = 1e8;
  p.memory_Bps = 1e10;
  p.checkpoint_bytes = 4 << 20;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    LayerProfile l{.index = int(i), .name = m.layers[i].name, .kind = m.layers[i].describe,
                   .params = m.layers[i].params, .flops = m.layers[i].flops, .splits = true,
                   .optimizer_s = 1e-4, .at = {}};
    // 1 ms + 0.1 ms per sample forward, twice that backward: per sample at 8 and 32.
    for (int64_t b : {8, 32}) {
      const double f = (1e-3 + 1e-4 * double(b)) / double(b);
      l.at.push_back({.micro_batch = b, .forward_s = f, .backward_s = 2 * f,
                      .backward_input_s = f, .backward_weight_s = f});
    }
    p.layers.push_back(l);
  }
  p.loss = {{.micro_batch = 8, .forward_s = 0, .backward_s = 0, .backward_input_s = 0, .backward_weight_s = 0}};
  return p;
}

const ModelSpec kMlpSpec = {"linear 64", "relu", "linear 32", "relu", "linear 10"};

PlannedModel mlp() {
  PlannedModel m;
  m.input = {784};
  m.classes = 10;
  m.layers = describe_layers(kMlpSpec, m.input, m.classes);
  return m;
}

}  // namespace

TEST_CASE("machine profile: written, read back, interpolated per micro-batch", "[plan]") {
  const PlannedModel m = mlp();
  MachineProfile p = mlp_profile(m);
  p.versions["onednn"] = "3.0";
  // Its own folder: in a fresh build no other test has made test-runs/ yet.
  const std::string dir = STRATA_BINARY_DIR "/test-runs/unit-machine-profile";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/profile.json";
  write_machine_profile(path, p);
  const MachineProfile q = read_machine_profile(path);
  REQUIRE(q.layers.size() == p.layers.size());
  CHECK(q.versions.at("onednn") == "3.0");
  const LayerProfile* l = q.find(0, m.layers[0].describe);
  REQUIRE(l);
  // Linear in the micro-batch between sizes, and beyond them along the last two.
  CHECK(MachineProfile::cost(*l, 16).forward_s == Approx(1e-3 + 16e-4));
  CHECK(MachineProfile::cost(*l, 64).backward_s == Approx(2 * (1e-3 + 64e-4)));
  CHECK(q.find(7, "Linear(1 -> 1)") == nullptr);
  std::ofstream(path) << "{\"strata_machine_profile\": 2, \"layers\": []}";
  CHECK_THROWS_WITH(read_machine_profile(path), Catch::Contains("strata_machine_profile"));
  std::ofstream(path) << machine_profile_json(p).substr(0, 200);
  CHECK_THROWS_WITH(read_machine_profile(path), Catch::Contains(path));
}

TEST_CASE("step time: composed from the profile, the schedule and the comm model", "[plan]") {
  const PlannedModel m = mlp();
  const MachineProfile p = mlp_profile(m);
  RunConfig cfg;
  cfg.train.batch_size = 32;
  const CommModel none;
  double sum = 0;  // the model's layers at 32 samples: forward + backward + optimizer
  for (const auto& l : p.layers) sum += 3 * (1e-3 + 32e-4) + l.optimizer_s;
  GridChoice g;
  const StepTime one = predict_step_time(cfg, m, g, p, none);
  CHECK(one.total_s == Approx(sum));
  CHECK(one.bubble_s == Approx(0).margin(1e-12));
  // D = 2: half the batch each, plus the whole gradient sum exposed (MPI on the CPU).
  const CommModel c = CommModel::from_profile_text(kProfile, "p.json");
  g.data = 2, g.ranks_per_node = 2;
  // One sum per gradient bucket, cut as GradientAllreducer cuts a real model's flat buffer
  // (its tensors' padded ends), and the step's 5-number allreduce (40 bytes).
  auto sums_of = [&](double bucket_mb) {
    const Model real(kMlpSpec, m.input, m.classes);
    std::vector<int64_t> ends;
    for (const Param* t : real.params()) ends.push_back(t->offset + flat_span(numel(t->shape)));
    std::sort(ends.begin(), ends.end());
    const std::vector<int64_t> b = bucket_bounds(ends, int64_t(bucket_mb * 1048576 / 4));
    double s = c.seconds(CommOp::allreduce, 40, 2, CommLevel::kIntra);
    for (size_t i = 0; i + 1 < b.size(); ++i) s += c.seconds(CommOp::allreduce, double(b[i + 1] - b[i]) * 4, 2, CommLevel::kIntra);
    return std::pair{s, b.size() - 1};
  };
  const StepTime two = predict_step_time(cfg, m, g, p, c);
  CHECK(sums_of(1.0).second == 2);  // fc3, fc2 and fc1's weight; fc1's bias alone
  CHECK(two.exposed_comm_s == Approx(sums_of(1.0).first));
  CHECK(two.compute_s < one.compute_s);
  RunConfig small = cfg;
  small.dp.bucket_mb = 0.01;
  CHECK(sums_of(0.01).second == 3);
  CHECK(predict_step_time(small, m, g, p, c).exposed_comm_s == Approx(sums_of(0.01).first));
  // Four ranks on the profile's 2 cores: every rank's compute twice as slow.
  g.data = 4, g.ranks_per_node = 4;
  const StepTime four = predict_step_time(cfg, m, g, p, c);
  CHECK(four.oversubscription == Approx(2));
  CHECK(four.compute_s == Approx(2 * double(p.layers.size()) * 3 * (1e-3 + 8e-4)));
  // P = 2: the simulated span, more than the busier stage's work alone.
  g = GridChoice{.data = 1, .pipeline = 2, .micro_batches = 4};
  const StepTime pipe = predict_step_time(cfg, m, g, p, c);
  CHECK(pipe.bubble_s > 0);
  CHECK(pipe.reason.find("P = 2 pays") != std::string::npos);
  // D = 2 x P = 2 on the profile's 2 cores: the pipeline's stages share them, simulated so.
  GridChoice shared{.data = 2, .pipeline = 2, .micro_batches = 4, .ranks_per_node = 4};
  const StepTime st = predict_step_time(cfg, m, shared, p, c);
  CHECK(st.shared_cores);
  CHECK(st.reason.find("idle in its bubble leaves the core to the others") != std::string::npos);
  shared.ranks_per_node = 2;  // a node per replica: each stage its own core
  CHECK_FALSE(predict_step_time(cfg, m, shared, p, c).shared_cores);
  g.micro_batches = 3;
  CHECK_THROWS_WITH(predict_step_time(cfg, m, g, p, c), Catch::Contains("train.batch_size = 32"));
}

TEST_CASE("step time: the layers as the whole pass runs them (bench layers' unprofiled pass)", "[plan]") {
  const PlannedModel m = mlp();
  MachineProfile p = mlp_profile(m);
  RunConfig cfg;
  cfg.train.batch_size = 32;
  const CommModel c = CommModel::from_profile_text(kProfile, "p.json");
  // Layer by layer: every layer 3 (1 ms + 0.1 ms per sample) a micro-batch, the loss 0.
  const double L = double(p.layers.size());
  auto layers_at = [&](double b) { return L * 3 * (1e-3 + 1e-4 * b); };
  GridChoice g;
  const double before_one = predict_step_time(cfg, m, g, p, c).compute_s;
  CHECK(before_one == Approx(layers_at(32)));
  // The whole pass measured 0.7x the sum at 32 samples and 1.2x at 8 (what runs between the
  // layers, or their outputs still in cache for the next): the layers follow it per size.
  p.whole = {{.micro_batch = 8, .forward_s = 1.2 * layers_at(8) / 8},
             {.micro_batch = 32, .forward_s = 0.7 * layers_at(32) / 32}};
  CHECK(p.whole_ratio(32) == Approx(0.7));
  CHECK(p.whole_ratio(8) == Approx(1.2));
  const StepTime one = predict_step_time(cfg, m, g, p, c);
  CHECK(one.compute_s == Approx(0.7 * layers_at(32)));
  CHECK(one.total_s == Approx(0.7 * layers_at(32) + L * 1e-4 + c.seconds(CommOp::allreduce, 40, 1, CommLevel::kIntra)).epsilon(1e-6));
  g.data = 4;
  CHECK(predict_step_time(cfg, m, g, p, c).compute_s == Approx(1.2 * layers_at(8)));
  // Written and read back; a profile without it reads as before (ratio 1).
  const std::string dir = STRATA_BINARY_DIR "/test-runs/unit-machine-profile-whole";
  std::filesystem::create_directories(dir);
  write_machine_profile(dir + "/p.json", p);
  const MachineProfile q = read_machine_profile(dir + "/p.json");
  REQUIRE(q.whole.size() == 2);
  CHECK(q.whole_ratio(32) == Approx(0.7));
  CHECK(mlp_profile(m).whole_ratio(32) == 1);
}

TEST_CASE("step time: a step pays its batch from the loader (and a device's upload) once, before the first forward", "[plan]") {
  const PlannedModel m = mlp();
  MachineProfile p = mlp_profile(m);
  p.device = "cuda";
  RunConfig cfg;
  cfg.train.batch_size = 32;
  const CommModel c = CommModel::from_profile_text(kProfile, "p.json");
  GridChoice g;
  const double without = predict_step_time(cfg, m, g, p, c).compute_s;
  // 5 us + 1 us a sample, measured at 8 and 32 samples (seconds per sample).
  p.input = {{.micro_batch = 8, .forward_s = (5e-6 + 8e-6) / 8}, {.micro_batch = 32, .forward_s = (5e-6 + 32e-6) / 32}};
  CHECK(p.input_s(32) == Approx(37e-6));
  const StepTime one = predict_step_time(cfg, m, g, p, c);
  CHECK(one.compute_s == Approx(without + 37e-6));
  bool said = false;
  for (const std::string& a : one.assumptions)
    said |= a.find("the batch from the loader and its copy to the device 0.037 ms") != std::string::npos;
  CHECK(said);
  // M = 4 micro-batches on one rank: still one upload of the 32 samples a step.
  g.micro_batches = 4;
  const double m4_without = [&] { MachineProfile q = p; q.input.clear(); return predict_step_time(cfg, m, g, q, c).compute_s; }();
  CHECK(predict_step_time(cfg, m, g, p, c).compute_s == Approx(m4_without + 37e-6));
  // Written and read back; a profile without the figure adds nothing.
  const std::string dir = STRATA_BINARY_DIR "/test-runs/unit-machine-profile-input";
  std::filesystem::create_directories(dir);
  write_machine_profile(dir + "/p.json", p);
  CHECK(read_machine_profile(dir + "/p.json").input_s(32) == Approx(37e-6));
  CHECK(mlp_profile(m).input_s(32) == 0);
  // On the CPU the loader's gather, the same way, and slowed with every op where ranks share a
  // core: 4 ranks on 2 cores.
  p.device = "cpu";
  g.micro_batches = 1;
  CHECK(predict_step_time(cfg, m, g, p, c).compute_s == Approx(without + 37e-6));
  said = false;
  for (const std::string& a : predict_step_time(cfg, m, g, p, c).assumptions)
    said |= a.find("the batch from the loader 0.037 ms") != std::string::npos;
  CHECK(said);
  g.data = 4, g.ranks_per_node = 4;
  const double four_without = [&] { MachineProfile q = p; q.input.clear(); return predict_step_time(cfg, m, g, q, c).compute_s; }();
  CHECK(predict_step_time(cfg, m, g, p, c).compute_s == Approx(four_without + 2 * p.input_s(8)));
}

TEST_CASE("step time: a busy node slows compute by the profile's measured factor", "[plan]") {
  const PlannedModel m = mlp();
  MachineProfile p = mlp_profile(m);  // 2 cores
  p.cores = 4;
  RunConfig cfg;
  cfg.train.batch_size = 32;
  const CommModel c = CommModel::from_profile_text(kProfile, "p.json");
  GridChoice g{.data = 2, .ranks_per_node = 2};
  const double plain = predict_step_time(cfg, m, g, p, c).compute_s;
  // Measured on 3 ranks: 1.3x. Two of a node's ranks: one other, half of the measured two.
  p.busy_ranks = 3, p.busy_slowdown = 1.3;
  CHECK(p.busy_factor(1) == 1);
  CHECK(p.busy_factor(2) == Approx(1.15));
  CHECK(p.busy_factor(3) == Approx(1.3));
  CHECK(p.busy_factor(8) == Approx(1.3));
  const StepTime two = predict_step_time(cfg, m, g, p, c);
  CHECK(two.busy_node == Approx(1.15));
  CHECK(two.compute_s == Approx(1.15 * plain));
  CHECK(two.reason.find("2 ranks of a node at once: compute 1.15x slower") != std::string::npos);
  // The same ranks on two nodes, one each: no slowdown.
  g.ranks_per_node = 1;
  CHECK(predict_step_time(cfg, m, g, p, c).busy_node == 1);
  // Written and read back; a profile without it has none; a bad one names the key.
  const std::string dir = STRATA_BINARY_DIR "/test-runs/unit-machine-profile-busy";
  std::filesystem::create_directories(dir);
  write_machine_profile(dir + "/p.json", p);
  const MachineProfile q = read_machine_profile(dir + "/p.json");
  CHECK(q.busy_ranks == 3);
  CHECK(q.busy_slowdown == Approx(1.3));
  CHECK(mlp_profile(m).busy_factor(2) == 1);
  std::string text = machine_profile_json(p);
  const std::string good = "\"slowdown\": 1.3";
  text.replace(text.find(good), good.size(), "\"slowdown\": -1");
  std::ofstream(dir + "/bad.json") << text;
  CHECK_THROWS_WITH(read_machine_profile(dir + "/bad.json"), Catch::Contains("key \"busy.slowdown\""));
}

TEST_CASE("bench layers: the default sizes are those grids run at, measured not interpolated", "[plan]") {
  // G = 32: micro-batches 32 (D = 1), 16 (D = 2), 8 (D = 4), 4 (P = 2, M = 8), 2: all measured.
  CHECK(default_micro_batches(32) == std::vector<int64_t>{2, 4, 8, 16, 32});
  CHECK(default_micro_batches(64) == std::vector<int64_t>{4, 8, 16, 32, 64});
  CHECK(default_micro_batches(48) == std::vector<int64_t>{4, 8, 16, 32, 48});
  CHECK(default_micro_batches(1) == std::vector<int64_t>{1});
  // Why: a cost that is not linear in the micro-batch (a working set past a cache at 16) is
  // what the model then uses at 16, where three sizes would have drawn a line through it.
  const PlannedModel m = mlp();
  MachineProfile p = mlp_profile(m);
  for (LayerProfile& l : p.layers) {
    const LayerTiming at8 = l.at[0], at32 = l.at[1];
    LayerTiming at16 = at8;
    at16.micro_batch = 16;
    at16.forward_s = 1.5 * (1e-3 + 16e-4) / 16;  // 1.5x the line through 8 and 32
    at16.backward_s = 2 * at16.forward_s;
    at16.backward_input_s = at16.backward_weight_s = at16.forward_s;
    l.at = {at8, at16, at32};
  }
  RunConfig cfg;
  cfg.train.batch_size = 32;
  GridChoice g;
  g.data = 2;
  const CommModel c = CommModel::from_profile_text(kProfile, "p.json");
  const double line = double(p.layers.size()) * 3 * (1e-3 + 16e-4);
  CHECK(predict_step_time(cfg, m, g, p, c).compute_s == Approx(1.5 * line));
}
