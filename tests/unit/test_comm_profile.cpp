// The communication profile's arithmetic (plan/comm_profile.h): nccl-tests' bus-bandwidth
// factors, the sizes users type, the latency + bandwidth fit and the JSON strata plan reads.
#include <catch2/catch.hpp>

#include "base/json.h"
#include "plan/comm_profile.h"
#include "strata/error.h"

using namespace strata;

TEST_CASE("comm profile: bus bandwidth factors are nccl-tests'", "[plan]") {
  // doc/PERFORMANCE.md of NVIDIA/nccl-tests: allreduce 2(n-1)/n, reduce-scatter and
  // all-gather (n-1)/n, send/receive 1.
  for (int n : {2, 3, 4, 8, 1024}) {
    const double d = n;
    CHECK(busbw_factor(CommOp::allreduce, n) == Approx(2 * (d - 1) / d));
    CHECK(busbw_factor(CommOp::reduce_scatter, n) == Approx((d - 1) / d));
    CHECK(busbw_factor(CommOp::all_gather, n) == Approx((d - 1) / d));
    CHECK(busbw_factor(CommOp::sendrecv, n) == 1);
  }
  CHECK(busbw_factor(CommOp::allreduce, 2) == 1);
  CHECK(busbw_factor(CommOp::allreduce, 8) == Approx(1.75));
  CHECK(busbw_factor(CommOp::all_gather, 4) == Approx(0.75));
  CommMeasurement m{.op = CommOp::allreduce, .level = "intra", .ranks = 4, .bytes = 1 << 20,
                    .time_s = 1e-3};
  CHECK(m.algbw_Bps() == Approx(1048576e3));
  CHECK(m.busbw_Bps() == Approx(1048576e3 * 1.5));
}

TEST_CASE("comm profile: sizes as users type them, and bad ones name the flag", "[plan]") {
  CHECK(parse_byte_size("8", "--min_bytes") == 8);
  CHECK(parse_byte_size("64K", "--min_bytes") == 65536);
  CHECK(parse_byte_size("1M", "--max_bytes") == 1 << 20);
  CHECK(parse_byte_size("1G", "--max_bytes") == int64_t(1) << 30);
  CHECK(parse_byte_size("4G", "--max_bytes") == int64_t(4) << 30);
  for (const char* bad : {"", "0", "-8", "1.5M", "8X", "K", "5G", "0x10", "1e3"})
    CHECK_THROWS_WITH(parse_byte_size(bad, "--max_bytes"), Catch::Contains("flag --max_bytes"));
  CHECK(parse_comm_op("reduce_scatter", "--ops") == CommOp::reduce_scatter);
  CHECK_THROWS_WITH(parse_comm_op("alltoall", "--ops"), Catch::Contains("unknown op 'alltoall'"));
}

TEST_CASE("comm profile: the fit is latency from small sizes and busbw from large ones", "[plan]") {
  // A made-up machine: 5 us + bytes x factor / 10 GB/s, measured from 8 B to 64 MiB.
  const double lat = 5e-6, bw = 1e10;
  std::vector<CommMeasurement> ms;
  for (int64_t b = 8; b <= (int64_t(64) << 20); b *= 2)
    ms.push_back({.op = CommOp::allreduce, .level = "intra", .ranks = 4, .bytes = b,
                  .time_s = lat + double(b) * busbw_factor(CommOp::allreduce, 4) / bw});
  const auto f = fit_comm(ms, CommOp::allreduce, "intra");
  REQUIRE(f);
  CHECK(f->latency_s == Approx(lat).epsilon(0.05));
  CHECK(f->busbw_Bps == Approx(bw).epsilon(0.05));
  CHECK_FALSE(fit_comm(ms, CommOp::allreduce, "inter"));
  CHECK_FALSE(fit_comm(ms, CommOp::sendrecv, "intra"));
  const int64_t big = int64_t(256) << 20;
  CHECK(predicted_time_s(*f, CommOp::allreduce, big, 4) ==
        Approx(lat + double(big) * 1.5 / bw).epsilon(0.05));

  CommProfile p;
  p.date = "2026-11-26T11:00:00Z";
  p.host = "node\"01";  // quoted in the JSON
  p.strata_version = "strata 1.0 (abc)";
  p.ranks = 4;
  p.ranks_per_node = 4;
  p.measurements = ms;
  const JsonValue j = parse_json(comm_profile_json(p), "profile");
  CHECK(j.find("strata_comm_profile")->int_value == 1);
  CHECK(j.find("source")->text == "measured");
  CHECK(j.find("host")->text == "node\"01");
  CHECK(j.find("backend")->text == "mpi");
  CHECK(j.find("ranks")->int_value == 4);
  CHECK(j.find("nodes")->int_value == 1);
  const JsonValue* fit = j.find("fit");
  REQUIRE(fit);
  CHECK(fit->members.size() == 1);
  const JsonValue* intra = fit->find("allreduce")->find("intra");
  CHECK(intra->find("latency_s")->number == Approx(f->latency_s).epsilon(1e-5));
  CHECK(intra->find("busbw_Bps")->number == Approx(f->busbw_Bps).epsilon(1e-5));
  CHECK_FALSE(fit->find("allreduce")->find("inter"));
  const JsonValue* list = j.find("measurements");
  REQUIRE(list->items.size() == ms.size());
  const JsonValue& last = list->items.back();
  CHECK(last.find("op")->text == "allreduce");
  CHECK(last.find("level")->text == "intra");
  CHECK(last.find("bytes")->int_value == int64_t(64) << 20);
  CHECK(last.find("busbw_Bps")->number == Approx(ms.back().busbw_Bps()).epsilon(1e-5));
}
