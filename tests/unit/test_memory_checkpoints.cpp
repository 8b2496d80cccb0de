// Memory checkpoints (checkpoint/memory_checkpoints.h) on in-process ranks given node names of
// their own: the pairing across nodes, the partner's copy, and what a restart finds when a
// node's directory is gone, a copy is damaged, or the copies are another attempt's.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/crc32c.h"
#include "checkpoint/memory_checkpoints.h"
#include "strata/lane_sums.h"
#include "ranks_util.h"
#include "test_util.h"

namespace fs = std::filesystem;
using strata::MemoryCheckpoints;
using strata::test::on_ranks;

namespace {

constexpr int64_t kFloats = 300001;  // over 1 MiB: the exchange sends it in 3 pieces
// The parts differ in size (a pipeline's stages do): rank 1's goes in 2 pieces, rank 0's in 3.
int64_t floats_of(int rank) { return rank == 0 ? kFloats : kFloats / 2 + 7; }

float value(int rank, int64_t step, int64_t i) { return float(rank * 100000 + step * 1000 + i); }

// Two ranks on nodes n1 and n2, each with the directory root/<node>.
MemoryCheckpoints::Identity identity(int64_t attempt = 0) {
  return {.job = "42", .attempt = attempt, .run = "the run"};
}
std::string node_of(int rank) { return rank == 0 ? "n1" : "n2"; }

// Data-parallel replicas: both ranks hold rank 0's part (size and values), key 0. In place:
// each save written straight into its slot's file (open_slot, publish_slot with the lane
// sums), as the optimizer's update does, instead of copied by save().
struct Parts {
  bool replicas = false;
  bool in_place = false;
  int content(int rank) const { return replicas ? 0 : rank; }
  int64_t same_as() const { return replicas ? 0 : -1; }
};

// The file holding `part`'s copy of `step` in `dir` (named for its step, or a generation the
// update wrote, named for its slot), or an empty path.
fs::path file_of(const fs::path& dir, int part, int64_t step, bool own = true) {
  return strata::memory_copy_file(dir.string(), part, step, own);
}

size_t count(const fs::path& dir, const std::string& ending) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().string().ends_with(ending);
  return n;
}

// Saves steps first..last on both ranks; the fill of step `failing` throws (a GPU's copy failed).
// killed_in_update (in place): then the next update's target is opened and the launch ends
// there, as a rank killed before the update wrote a byte. copied_from (in place): that step and
// later ones copied, as when the budget's copies take over.
void save_steps(const fs::path& root, int64_t last = 3, int64_t failing = 0, Parts parts = {},
                int64_t first = 1, bool killed_in_update = false, int64_t copied_from = 0) {
  strata::run_ranks(2, [&](strata::Comm& c) {
    const int rank = parts.content(c.rank());
    MemoryCheckpoints m((root / node_of(c.rank())).string(), c, floats_of(rank), identity(),
                        node_of(c.rank()), parts.same_as());
    CHECK(m.replicated() == parts.replicas);
    m.preflight();
    for (int64_t step = first; step <= last; ++step) {
      double wait = 0;
      if (parts.in_place && (copied_from == 0 || step < copied_from)) {
        // As UpdateGenerations does: the generation the state lives in first, then the
        // update's target; both files exist before the launch's first publish.
        if (step == first) REQUIRE(m.open_slot(int((step + 1) % 2), step - 1, &wait) != nullptr);
        float* p = m.open_slot(int(step % 2), step, &wait);
        // An earlier launch's copies stay until this launch publishes (a restore may have taken
        // one older than their newest).
        if (step == first && first > 1) CHECK(count(root / node_of(c.rank()), ".own") == 2);
        REQUIRE(p != nullptr);
        const int64_t n = floats_of(rank);
        for (int64_t i = 0; i < n; ++i) p[i] = value(rank, step, i);
        uint32_t sums[strata::kRunningWords] = {};
        strata::lane_sums_place(sums, p, n, 0);
        m.publish_slot(int(step % 2), step, sums);
        continue;
      }
      m.save(step, nullptr, [rank, step, failing](strata::PartWriter& w, int) {
        if (step == failing) throw std::runtime_error("a device error");
        std::vector<float> p(size_t(floats_of(rank)));
        for (size_t i = 0; i < p.size(); ++i) p[i] = value(rank, step, int64_t(i));
        w.put(p.data(), p.size() * 4);
      }, &wait);
      m.fence();
    }
    double wait = 0;
    if (killed_in_update) REQUIRE(m.open_slot(int((last + 1) % 2), last + 1, &wait) != nullptr);
    m.drain();
  });
}

struct Restored {
  int64_t step = -1, from_partner = 0, from_replica = 0;
  bool exact = false;
  std::string why;
};
std::vector<Restored> restore(const fs::path& root, int64_t attempt = 0, Parts parts = {}) {
  return on_ranks(2, [&](strata::Comm& c) {
    const int rank = parts.content(c.rank());
    MemoryCheckpoints m((root / node_of(c.rank())).string(), c, floats_of(rank),
                        identity(attempt), node_of(c.rank()), parts.same_as());
    Restored r;
    const auto f = m.find();
    r.step = f.step;
    r.from_partner = f.from_partner;
    r.from_replica = f.from_replica;
    r.why = f.why;
    if (f.step < 0) return r;
    std::vector<float> out(size_t(floats_of(rank)));
    m.take(f, out.data());
    r.exact = true;
    for (size_t i = 0; i < out.size(); ++i)
      r.exact = r.exact && out[i] == value(rank, f.step, int64_t(i));
    return r;
  });
}

// A byte of the payload changed, as a memory error would.
void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(500);
  f.put('\x5a');
}


}  // namespace

TEST_CASE("memory checkpoints: parts span nodes only when every part is on two nodes or more", "[memory]") {
  // Keys by rank (a part's key; -1 a part of its own), nodes by rank.
  CHECK(strata::parts_span_nodes({7, 7, 9, 9}, {0, 1, 0, 1}));
  CHECK_FALSE(strata::parts_span_nodes({7, 7, 9, 9}, {0, 0, 1, 1}));  // each part on one node
  CHECK_FALSE(strata::parts_span_nodes({7, 7, 9, 9}, {0, 1, 1, 1}));  // part 9 on node 1 alone
  CHECK(strata::parts_span_nodes({7, 7, 7, 9, 9}, {1, 1, 0, 2, 0}));   // a second node late in the list
  CHECK_FALSE(strata::parts_span_nodes({7, -1}, {0, 1}));
  CHECK_FALSE(strata::parts_span_nodes({7}, {0}));
}

TEST_CASE("memory checkpoints: ranks pair with the same local rank on the next node", "[memory]") {
  auto p = strata::pair_ranks({"a", "a", "b", "b"}, 1);
  CHECK(p.partner == 3);
  CHECK(p.source == 3);
  CHECK(p.local_rank == 1);
  CHECK(p.local_size == 2);
  p = strata::pair_ranks({"a", "b", "c"}, 0);
  CHECK(p.partner == 1);
  CHECK(p.source == 2);
  p = strata::pair_ranks({"a", "a"}, 0);  // one node: no partner
  CHECK(p.partner == -1);
  CHECK(p.source == -1);
}

TEST_CASE("memory checkpoints: own and partner copies, two generations, restored exactly",
          "[memory]") {
  // Each rank's part its own, kept also by the partner on the other node; or (replicas) both
  // ranks holding the same part (same_as 0) on nodes n1 and n2: no partner exchange, and a part
  // whose own copy is gone comes from the replica's own copy on the other node.
  // Each saved by a copy or written in place (the generations the optimizer's update writes).
  const Parts parts{.replicas = GENERATE(false, true), .in_place = GENERATE(false, true)};
  INFO((parts.replicas ? "data-parallel replicas" : "parts of their own")
       << (parts.in_place ? ", written in place" : ", copied"));
  // Parts taken from another rank's copy: the partner's, or a replica's.
  auto from_other = [&](const Restored& x) { return parts.replicas ? x.from_replica : x.from_partner; };
  strata::test::TempDir tmp;
  const fs::path root = tmp.path;
  save_steps(root, 3, 0, parts);
  for (const char* node : {"n1", "n2"}) {
    CHECK(count(root / node, ".own") == 2);  // steps 2 and 3
    CHECK(count(root / node, ".peer") == (parts.replicas ? 0 : 2));
    // Written in place, they keep their slots' names: no rename at each step.
    CHECK(count(root / node, "-gen0.own") + count(root / node, "-gen1.own") == (parts.in_place ? 2 : 0));
  }
  auto r = restore(root, 0, parts);
  for (const auto& x : r) {
    CHECK(x.step == 3);
    CHECK(x.from_partner + x.from_replica == 0);
    CHECK(x.exact);
  }

  SECTION("a relaunch's saves leave two generations again") {
    save_steps(root, 5, 0, parts, 4);
    for (const char* node : {"n1", "n2"}) {
      CHECK(count(root / node, ".own") == 2);  // steps 4 and 5: step 3's is gone
      CHECK(count(root / node, ".peer") == (parts.replicas ? 0 : 2));
    }
    for (const auto& x : restore(root, 0, parts)) CHECK((x.step == 5 && x.exact));
  }
  if (parts.in_place) {
    SECTION("an update killed before it wrote: its target, whole, is never taken") {
      // Steps 4 and 5, then step 6's update opens step 4's own file and stops: with step 5
      // gone, a restart must not take that file, though its bytes are all step 4's: the
      // partner's copy of step 4 is taken instead, or (replicas: none) nothing.
      save_steps(root, 5, 0, parts, 4, /*killed_in_update=*/true);
      for (const char* node : {"n1", "n2"})
        for (int part : {0, 1})
          for (bool own : {true, false}) fs::remove(file_of(root / node, part, 5, own));
      for (const auto& x : restore(root, 0, parts)) {
        CHECK(x.step == (parts.replicas ? -1 : 4));
        CHECK(x.from_partner == (parts.replicas ? 0 : 2));  // both parts
        CHECK(x.exact == !parts.replicas);
      }
      CHECK(count(root / "n1", ".own") + count(root / "n2", ".own") == 0);  // removed
    }
  }
  SECTION("a node's directory gone: its part comes from the other node") {
    fs::remove_all(root / "n1");
    r = restore(root, 0, parts);
    for (const auto& x : r) {
      CHECK(x.step == 3);
      CHECK(from_other(x) == 1);
      CHECK(x.exact);
    }
  }
  SECTION("a flipped byte: the copy is skipped and removed, the other node's taken") {
    const fs::path own = file_of(root / "n2", 1, 3);
    REQUIRE(fs::exists(own));
    flip_byte(own);
    r = restore(root, 0, parts);
    CHECK_FALSE(fs::exists(own));
    for (const auto& x : r) {
      CHECK(x.step == 3);
      CHECK(from_other(x) == 1);
      CHECK(x.exact);
    }
  }
  SECTION("both copies of a part gone at the newest step: the step before") {
    REQUIRE(fs::remove(file_of(root / "n2", 1, 3)));
    REQUIRE(fs::remove(file_of(root / "n1", parts.replicas ? 0 : 1, 3, parts.replicas)));
    r = restore(root, 0, parts);
    for (const auto& x : r) {
      CHECK(x.step == 2);
      CHECK(x.exact);
    }
  }
  SECTION("every copy gone: nothing taken, and why") {
    fs::remove_all(root / "n1");
    fs::remove_all(root / "n2");
    r = restore(root, 0, parts);
    CHECK(r[0].step == -1);
    CHECK(r[0].why == "no memory copies");
  }
  SECTION("another attempt of the job (a requeue): removed, nothing taken") {
    r = restore(root, /*attempt=*/1, parts);
    for (const auto& x : r) CHECK(x.step == -1);
    CHECK(count(root / "n1", "") == 0);
    CHECK(count(root / "n2", "") == 0);
  }
}

TEST_CASE("memory checkpoints: two replicas per node: each rank takes its own part's copy first", "[memory]") {
  // Four data-parallel replicas, two per node. Their parts differ in one float (as rank 0's
  // carries the goodput ledger's time): a restore takes each part's own copy wherever one is
  // (a node's ranks each scan a share of its directory), a replica's only when none is left.
  strata::test::TempDir tmp;
  const fs::path root = tmp.path;
  static constexpr int64_t kN = 1000;
  auto node = [](int r) { return r < 2 ? std::string("n1") : std::string("n2"); };
  strata::run_ranks(4, [&](strata::Comm& c) {
    const int r = c.rank();
    MemoryCheckpoints m((root / node(r)).string(), c, kN, identity(), node(r), 0);
    CHECK(m.replicated());
    m.preflight();
    for (int64_t step = 1; step <= 3; ++step) {
      double wait = 0;
      m.save(step, nullptr, [r, step](strata::PartWriter& w, int) {
        std::vector<float> p(static_cast<size_t>(kN));
        for (size_t i = 0; i < p.size(); ++i) p[i] = i == 0 ? float(r) : value(0, step, int64_t(i));
        w.put(p.data(), p.size() * 4);
      }, &wait);
      m.fence();
    }
    m.drain();
  });
  CHECK(count(root / "n1", ".peer") + count(root / "n2", ".peer") == 0);
  auto restore4 = [&] {
    return on_ranks(4, [&](strata::Comm& c) {
      const int r = c.rank();
      MemoryCheckpoints m((root / node(r)).string(), c, kN, identity(), node(r), 0);
      const auto f = m.find();
      std::vector<float> out(static_cast<size_t>(kN), -1.0f);
      if (f.step >= 0) m.take(f, out.data());
      bool rest = true;
      for (size_t i = 1; i < out.size(); ++i) rest = rest && out[i] == value(0, f.step, int64_t(i));
      return std::array<int64_t, 5>{f.step, f.from_partner, f.from_replica, int64_t(out[0]), rest};
    });
  };
  auto r = restore4();
  for (int k = 0; k < 4; ++k) {
    INFO("rank " << k);
    CHECK(r[size_t(k)] == std::array<int64_t, 5>{3, 0, 0, k, 1});
  }
  fs::remove_all(root / "n1");  // ranks 0 and 1: a replica's copy from n2
  r = restore4();
  for (int k = 0; k < 4; ++k) {
    INFO("rank " << k);
    CHECK(r[size_t(k)][0] == 3);
    CHECK(r[size_t(k)][2] == 2);
    CHECK(r[size_t(k)][3] == (k < 2 ? 2 : k));  // n2's lowest rank provides
    CHECK(r[size_t(k)][4] == 1);
  }
}

TEST_CASE("memory checkpoints: replicas on one node only still copy to a partner", "[memory]") {
  // Ranks 0 and 1 on n1 hold one part, 2 and 3 on n2 another: a lost node would lose both
  // copies of its part, so every part goes to its partner as before.
  strata::test::TempDir tmp;
  std::array<int, 4> replicated{};
  strata::run_ranks(4, [&](strata::Comm& c) {
    const int r = c.rank();
    const std::string node = r < 2 ? "n1" : "n2";
    MemoryCheckpoints m((tmp.path / node).string(), c, 1000, identity(), node, r / 2);
    replicated[size_t(r)] = m.replicated();
    CHECK(m.pairing().partner == (r + 2) % 4);
  });
  for (int x : replicated) CHECK(x == 0);
  // Replicas across the nodes (0 with 2, 1 with 3): none. Two parts, so the update keeps two
  // generations (one_part(): run/update_generations.h); one part on every rank: one.
  std::array<int, 4> one_part{};
  for (bool two_parts : {true, false}) {
    strata::run_ranks(4, [&](strata::Comm& c) {
      const int r = c.rank();
      const std::string node = r < 2 ? "n1" : "n2";
      MemoryCheckpoints m((tmp.path / node).string(), c, 1000, identity(), node,
                          two_parts ? r % 2 : 0);
      replicated[size_t(r)] = m.replicated();
      one_part[size_t(r)] = m.one_part();
      CHECK(m.pairing().partner == -1);
    });
    INFO("two parts " << two_parts);
    for (int x : replicated) CHECK(x == 1);
    for (int x : one_part) CHECK(x == (two_parts ? 0 : 1));
  }
}

// CRC-32C bit by bit: the reference for the part writer's CRC (SSE4.2 and the table).
static uint32_t crc32c_reference(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

TEST_CASE("memory checkpoints: the part writer copies every byte and CRCs what it copied", "[memory]") {
  // The check value of CRC-32C.
  const char nine[] = "123456789";
  char out9[9];
  strata::PartWriter w9(out9, 9);
  w9.put(nine, 4);
  w9.put(nine + 4, 5);
  CHECK(w9.finish() == 0xe3069283u);
  CHECK(std::memcmp(out9, nine, 9) == 0);
  // Pieces of every size at every alignment of the destination (a part starts 72 bytes into
  // its file, after the header): the same bytes and the same CRC as the whole.
  std::vector<unsigned char> src(100000);
  uint32_t x = 12345;
  for (auto& b : src) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t offset : {0, 1, 8, 72}) {
    std::vector<char> file(offset + src.size() + 16, 0);
    strata::PartWriter w(file.data() + offset, src.size());
    size_t at = 0;
    for (size_t piece = 1; at < src.size(); piece = piece * 3 + 1) {
      const size_t n = std::min(piece % 5000, src.size() - at);
      w.put(src.data() + at, n);
      at += n;
    }
    CHECK(w.left() == 0);
    CHECK(w.finish() == crc32c_reference(src.data(), src.size()));
    CHECK(std::memcmp(file.data() + offset, src.data(), src.size()) == 0);
  }
  strata::PartWriter full(nullptr, 0);
  CHECK_THROWS(full.put(nine, 1));  // more than the file holds
}

TEST_CASE("memory checkpoints: the CRC in three chains is the CRC, at every length around a block", "[memory]") {
  // A block is 3 stripes of 4 KiB (crc32c.cpp): lengths below, at and past one and several,
  // from every alignment of the source, alone and copied in one piece.
  std::vector<unsigned char> src(3 * 12288 + 200);
  uint32_t x = 777;
  for (auto& b : src) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t n : {size_t(12287), size_t(12288), size_t(12289), size_t(24576 + 8), size_t(3 * 12288 + 13)})
    for (size_t at : {0, 1, 3, 8}) {
      const uint32_t want = crc32c_reference(src.data() + at, n);
      CHECK(strata::crc32c(src.data() + at, n) == want);
      std::vector<char> file(n + 1);
      strata::PartWriter w(file.data() + 1, n);
      w.put(src.data() + at, n);
      CHECK(w.finish() == want);
      CHECK(std::memcmp(file.data() + 1, src.data() + at, n) == 0);
    }
}

TEST_CASE("memory checkpoints: copies after the update's generations replace the older one", "[memory]") {
  // Steps 1-4 written in place (step 4 in slot 0), then step 5 copied: it must replace step 3's
  // files, so that step 4's stays whole while step 5's copy is written.
  strata::test::TempDir tmp;
  save_steps(tmp.path, 5, 0, Parts{.in_place = true}, 1, false, /*copied_from=*/5);
  for (int rank : {0, 1}) {
    const fs::path dir = tmp.path / node_of(rank);
    CHECK(fs::exists(file_of(dir, rank, 4)));
    CHECK(fs::exists(file_of(dir, rank, 5)));
    CHECK(file_of(dir, rank, 3).empty());
  }
  for (const auto& x : restore(tmp.path)) CHECK((x.step == 5 && x.exact));
}

TEST_CASE("memory checkpoints: a relaunch from an older step keeps its own generations", "[memory]") {
  // Steps 1-5 written in place, then a relaunch that resumed from an older step (a checkpoint
  // file's, say) writes steps 2-3: its first publish removes the earlier launch's newer copies,
  // never its own, so both of its generations stay.
  strata::test::TempDir tmp;
  const Parts parts{.replicas = true, .in_place = true};
  save_steps(tmp.path, 5, 0, parts);
  save_steps(tmp.path, 3, 0, parts, 2);
  for (int rank : {0, 1}) {
    const fs::path dir = tmp.path / node_of(rank);
    CHECK(count(dir, ".own") == 2);
    CHECK(fs::exists(file_of(dir, rank, 2)));
    CHECK(fs::exists(file_of(dir, rank, 3)));
    CHECK(file_of(dir, rank, 5).empty());
  }
  for (const auto& x : restore(tmp.path, 0, parts)) CHECK((x.step == 3 && x.exact));
}

TEST_CASE("memory checkpoints: a fill that fails loses its save, not the run", "[memory]") {
  strata::test::TempDir tmp;
  save_steps(tmp.path, 2, /*failing=*/2);
  for (const auto& x : restore(tmp.path)) {
    CHECK(x.step == 1);  // step 2's copies were never published, on either node
    CHECK(x.exact);
  }
}

// The exchange yields to the training thread's gradient sums (comm/traffic_gate.h): while a
// rank's gate is closed nothing of its save goes to the partner; a gate closed for good holds
// each piece `most` at a time, not forever.
TEST_CASE("memory checkpoints: the exchange waits while the traffic gate is closed", "[memory]") {
  using namespace std::chrono_literals;
  for (bool reopened : {true, false}) {
    INFO((reopened ? "the gate opens after 300 ms" : "the gate stays closed, 20 ms at most a piece"));
    strata::test::TempDir tmp;
    const fs::path root = tmp.path;
    std::array<strata::TrafficGate, 2> gates;
    std::array<size_t, 2> held_while_closed{}, held_after{};
    strata::run_ranks(2, [&](strata::Comm& c) {
      const int rank = c.rank();
      MemoryCheckpoints m((root / node_of(rank)).string(), c, floats_of(rank), identity(), node_of(rank));
      m.preflight();
      gates[size_t(rank)].close();
      m.set_gate(&gates[size_t(rank)], reopened ? std::chrono::microseconds(10s) : std::chrono::microseconds(20ms));
      double wait = 0;
      m.save(1, nullptr, [rank](strata::PartWriter& w, int) {
        std::vector<float> p(size_t(floats_of(rank)));
        for (size_t i = 0; i < p.size(); ++i) p[i] = value(rank, 1, int64_t(i));
        w.put(p.data(), p.size() * 4);
      }, &wait);
      m.fence();
      if (reopened) {
        std::this_thread::sleep_for(300ms);
        held_while_closed[size_t(rank)] = count(root / node_of(rank), ".peer");
        gates[size_t(rank)].open();
      }
      m.drain();
      held_after[size_t(rank)] = count(root / node_of(rank), ".peer");
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(held_while_closed[size_t(r)] == 0);
      CHECK(held_after[size_t(r)] == 1);
    }
    for (const auto& x : restore(root)) {
      CHECK(x.step == 1);
      CHECK(x.exact);
    }
  }
}
