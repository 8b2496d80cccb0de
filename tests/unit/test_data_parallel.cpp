// The bucketed gradient allreducer (data_parallel.h) on 1..4 in-process ranks: after finish()
// every rank holds the serial sum of every rank's gradients, exactly (integer-valued floats:
// any order of addition gives the same sum, so only a missed, doubled or early bucket can
// change it), and the buckets tile the buffer once each, in order, started during backward
// when overlapping; and from wherever the model's gradients were moved to (rebind_grads).
#include <catch2/catch.hpp>

#include <algorithm>
#include <tuple>

#include "parallel/data_parallel.h"
#include "parallel/zero.h"
#include "ranks_util.h"

using namespace strata;
using namespace strata::test;

namespace {

// What a gradient holds before backward writes it: far from any sum of real ones.
constexpr float kSentinel = 1e6f;

// Forwards to a comm, recording the non-blocking sums started: (offset in grads, count).
class RecordingComm final : public Comm {
 public:
  RecordingComm(Comm& c, const float* grads) : base(grads), c_(c) {}
  std::vector<std::pair<int64_t, int64_t>> started;
  bool started_unready = false;  // a bucket started while it held a sentinel
  const strata::TrafficGate* gate = nullptr;
  bool started_open = false;  // a bucket started with the gate open

  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void allreduce_sum(float* x, int64_t n) override { c_.allreduce_sum(x, n); }
  void allreduce_sum(double* x, int64_t n) override { c_.allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { c_.allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { c_.allreduce_min(x, n); }
  void allreduce_max(double* x, int64_t n) override { c_.allreduce_max(x, n); }
  void broadcast(void* b, int64_t bytes, int root) override { c_.broadcast(b, bytes, root); }
  void barrier() override { c_.barrier(); }
  int start_allreduce_sum(float* x, int64_t n) override {
    started.emplace_back(x - base, n);
    for (int64_t i = 0; i < n; ++i) started_unready = started_unready || x[i] >= kSentinel;
    started_open = started_open || (gate && gate->is_open());
    return c_.start_allreduce_sum(x, n);
  }
  int start_send(const float* x, int64_t n, int to, int tag) override { return c_.start_send(x, n, to, tag); }
  int start_recv(float* x, int64_t n, int from, int tag) override { return c_.start_recv(x, n, from, tag); }
  int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& c) override {
    int64_t n = 0;
    for (int64_t k : c) n += k;
    started.emplace_back(x - base, n);
    for (int64_t i = 0; i < n; ++i) started_unready = started_unready || x[i] >= kSentinel;
    started_open = started_open || (gate && gate->is_open());
    return c_.start_reduce_scatter_sum(x, c);
  }
  int start_allgather(float* x, const std::vector<int64_t>& c) override {
    started_open = started_open || (gate && gate->is_open());
    return c_.start_allgather(x, c);
  }
  bool test(int h) override { return c_.test(h); }
  void wait(int h) override { c_.wait(h); }
  std::unique_ptr<Comm> split(int color, int key) override { return c_.split(color, key); }
  std::string host() const override { return c_.host(); }
  const float* base;  // the gradient buffer the offsets are in
  std::vector<std::string> all_gather_text(const std::string& t) override { return c_.all_gather_text(t); }
  std::unique_ptr<SideChannel> open_side_channel(int b, bool r, std::string* why) override {
    return c_.open_side_channel(b, r, why);
  }

 private:
  Comm& c_;
};

// Rank r's gradient element i in step s: an integer (sums of a few are exact in fp32); 0 in
// the flat buffer's padding (after each tensor, up to 256 bytes), which stays zero.
float grad(int s, int r, int64_t i) { return float((i * 7 + r * 13 + s * 5) % 23 - 11); }
std::vector<bool> data_mask(const Model& m) {
  std::vector<bool> data(size_t(m.num_params()), false);
  for (const Param* p : m.params()) std::fill_n(data.begin() + p->offset, numel(p->shape), true);
  return data;
}

// What one rank saw over two steps.
struct Seen {
  std::vector<std::vector<float>> grads;                         // per step, after finish()
  std::vector<std::vector<std::pair<int64_t, int64_t>>> started;  // per step
  std::vector<size_t> started_in_backward;                        // per step
  int64_t buckets = 0, stat_buckets = 0, stat_bytes = 0;
  bool started_unready = false;
  // The traffic gate: open at a bucket's start, closed after finish(), or closed at a step's
  // start (the memory checkpoints' exchange would wait on it for good).
  bool gate_wrong = false;
};

// Two steps of a simulated backward: parameter k's gradient is written (over a sentinel that
// would show in the sum) just before backward reports it ready, last parameter first in the
// flat buffer's order, as Model::backward does.
Seen two_steps(Comm& comm, const ModelSpec& spec, const Shape& input, int classes,
               double bucket_bytes, bool overlap, bool zero2 = false) {
  Model model(spec, input, classes);
  // (offset, end with its padding) of each parameter
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (Param* p : model.params()) spans.emplace_back(p->offset, p->offset + flat_span(numel(p->shape)));
  std::sort(spans.begin(), spans.end());
  const std::vector<bool> data = data_mask(model);
  float* g = model.grads().data();
  RecordingComm rec(comm, g);
  const std::vector<int64_t> shards = zero_counts(model, comm.size());
  GradientAllreducer reducer(rec, model, model.grads(), bucket_bytes, overlap,
                             zero2 ? &shards : nullptr);
  strata::TrafficGate gate;
  reducer.set_gate(&gate);
  rec.gate = &gate;
  Seen seen;
  seen.buckets = reducer.num_buckets();
  Tensor moved({model.num_params()});
  for (int s = 0; s < 2; ++s) {
    if (s == 1) {  // the second step's gradients elsewhere, as memory checkpoints move them
      model.layout().rebind_grads(moved);
      g = moved.data();
      rec.base = g;
    }
    rec.started.clear();
    seen.gate_wrong = seen.gate_wrong || !gate.is_open();
    std::fill(g, g + model.num_params(), kSentinel * float(comm.rank() + 1));
    for (auto [begin, end] : spans) {
      for (int64_t i = begin; i < end; ++i) g[i] = data[size_t(i)] ? grad(s, comm.rank(), i) : 0.f;
      reducer.on_grads_ready(end);
    }
    seen.started_in_backward.push_back(rec.started.size());
    reducer.finish();
    seen.gate_wrong = seen.gate_wrong || !gate.is_open();
    seen.grads.emplace_back(g, g + model.num_params());
    seen.started.push_back(rec.started);
  }
  seen.started_unready = rec.started_unready;
  seen.gate_wrong = seen.gate_wrong || rec.started_open;
  seen.stat_buckets = reducer.stats().buckets;
  seen.stat_bytes = reducer.stats().bytes;
  return seen;
}

struct Net {
  const char* name;
  ModelSpec spec;
  Shape input;
  int classes;
};

}  // namespace

TEST_CASE("gradient allreducer: every rank gets the serial sum, every bucket started once, in order", "[ranks]") {
  const Net nets[] = {
      // Parameters of 30, 5, 15, 3, 12 and 4 floats (69 in all).
      {"mlp", {"flatten", "linear 5", "relu", "linear 3", "linear 4"}, {2, 3}, 4},
      {"no parameters", {"relu"}, {6}, 6},
  };
  // 4 bytes: smaller than any parameter, so every parameter is a bucket of its own; 40: a
  // few parameters each (the first bucket is an eighth); 1 MiB: one bucket for everything.
  for (const Net& net : nets)
    for (double bucket_bytes : {4.0, 40.0, 1048576.0})
      for (bool overlap : {true, false})
        for (int n : {1, 2, 3, 4}) {
          INFO(net.name << ", bucket " << bucket_bytes << " bytes, overlap " << overlap << ", "
                        << n << " ranks");
          auto seen = on_ranks(n, [&](Comm& c) {
            return two_steps(c, net.spec, net.input, net.classes, bucket_bytes, overlap);
          });
          const Model model(net.spec, net.input, net.classes);
          const int64_t total = model.num_params();
          const std::vector<bool> data = data_mask(model);
          const int64_t params = int64_t(model.params().size());
          if (bucket_bytes == 4.0) CHECK(seen[0].buckets == params);
          if (bucket_bytes == 1048576.0) CHECK(seen[0].buckets == (total > 0 ? 1 : 0));
          for (int r = 0; r < n; ++r) {
            INFO("rank " << r);
            const Seen& s = seen[size_t(r)];
            CHECK(s.buckets == seen[0].buckets);
            for (int step = 0; step < 2; ++step) {
              INFO("step " << step);
              std::vector<float> sum(size_t(total), 0.0f);
              for (int q = 0; q < n; ++q)
                for (int64_t i = 0; i < total; ++i)
                  if (data[size_t(i)]) sum[size_t(i)] += grad(step, q, i);
              CHECK(same_bits(s.grads[size_t(step)], sum));
              // One rank allreduces nothing; otherwise every bucket once, in buffer order.
              const auto& st = s.started[size_t(step)];
              CHECK(int64_t(st.size()) == (n == 1 ? 0 : s.buckets));
              int64_t at = 0;
              for (auto [off, count] : st) {
                CHECK(off == at);
                CHECK(count > 0);
                at += count;
              }
              if (n > 1) CHECK(at == total);
              // Overlap: all started during backward (the last report covers everything).
              CHECK(s.started_in_backward[size_t(step)] == (overlap && n > 1 ? st.size() : 0u));
            }
            CHECK_FALSE(s.started_unready);
            CHECK_FALSE(s.gate_wrong);
            CHECK(s.stat_buckets == (n == 1 ? 0 : 2 * s.buckets));
            CHECK(s.stat_bytes == (n == 1 ? 0 : 2 * total * 4));
          }
        }
}

// ZeRO-2: each bucket reduce-scattered; each rank's shard (zero_counts) holds the serial sum.
TEST_CASE("ZeRO-2 reducer: each rank's shard gets the serial sum, every bucket scattered once, in order", "[ranks]") {
  const Net net = {"mlp", {"flatten", "linear 5", "relu", "linear 3", "linear 4"}, {2, 3}, 4};
  for (double bucket_bytes : {4.0, 40.0, 1048576.0})
    for (bool overlap : {true, false})
      for (int n : {2, 3, 4}) {
        INFO("bucket " << bucket_bytes << " bytes, overlap " << overlap << ", " << n << " ranks");
        auto seen = on_ranks(n, [&](Comm& c) {
          return two_steps(c, net.spec, net.input, net.classes, bucket_bytes, overlap, true);
        });
        const Model model(net.spec, net.input, net.classes);
        const std::vector<bool> data = data_mask(model);
        const auto shards = zero_counts(model, n);
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          const Seen& s = seen[size_t(r)];
          const OptimShard mine = zero_shard(shards, r);
          for (int step = 0; step < 2; ++step) {
            std::vector<float> want, got;
            for (int64_t i = mine.begin; i < mine.end; ++i) {
              float sum = 0;
              for (int q = 0; q < n; ++q) sum += data[size_t(i)] ? grad(step, q, i) : 0.f;
              want.push_back(sum);
              got.push_back(s.grads[size_t(step)][size_t(i)]);
            }
            CHECK(same_bits(got, want));
            int64_t at = 0;
            for (auto [off, count] : s.started[size_t(step)]) {
              CHECK(off == at);
              at += count;
            }
            CHECK(at == model.num_params());
            CHECK(s.started_in_backward[size_t(step)] == (overlap ? s.started[size_t(step)].size() : 0u));
          }
          CHECK_FALSE(s.started_unready);
          CHECK_FALSE(s.gate_wrong);
        }
      }
}

// ZeRO's parameter all-gather, on the training thread after the update, keeps background
// traffic out of its way as the gradient sums do (comm/traffic_gate.h).
TEST_CASE("ZeRO all-gather: the traffic gate closed while it runs, open after", "[ranks]") {
  const int64_t n = 1000;
  for (int d : {2, 3}) {
    INFO(d << " replicas");
    const auto counts = cache_line_shards(n, d);
    auto seen = on_ranks(d, [&](Comm& comm) {
      std::vector<float> v(size_t(n), -1.0f);
      int64_t at = 0;
      for (int r = 0; r < comm.rank(); ++r) at += counts[size_t(r)];
      for (int64_t i = at; i < at + counts[size_t(comm.rank())]; ++i) v[size_t(i)] = float(i);
      RecordingComm rec(comm, v.data());
      strata::TrafficGate gate;
      rec.gate = &gate;
      allgather_shards(rec, v.data(), counts, &gate);
      bool whole = true;
      for (int64_t i = 0; i < n; ++i) whole = whole && v[size_t(i)] == float(i);
      return std::tuple{rec.started_open, gate.is_open(), whole};
    });
    for (const auto& [started_open, open_after, whole] : seen) {
      CHECK_FALSE(started_open);
      CHECK(open_after);
      CHECK(whole);
    }
  }
}
