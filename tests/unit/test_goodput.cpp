// Issue 17's pieces that need no ranks: the goodput ledger across restarts, the Prometheus
// text file, and the node-local cache's verified copy and copier thread.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint_cache.h"
#include "run/goodput.h"
#include "run/prometheus.h"
#include "test_util.h"

namespace fs = std::filesystem;
using strata::GoodputLedger;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("goodput: a restart moves the steps after the checkpoint to recompute", "[goodput]") {
  strata::test::TempDir tmp;
  const std::string dir = tmp.path.string(), path = dir + "/goodput.toml";
  {
    GoodputLedger g(path, "77", 0);
    g.begin(0);
    for (int s = 1; s <= 150; ++s) {
      g.step_done(s, 0.01);
      if (s == 100) g.checkpoint(100, 0.5);
    }
    // No finish(): the attempt dies (its destructor stands for the last periodic update).
  }
  GoodputLedger g(path, "77", 0);
  g.begin(100);
  const auto f = g.figures();
  CHECK(f.restarts == 1);
  CHECK(f.useful_s == Approx(1.00).epsilon(1e-9));  // steps 1-100
  CHECK(f.recompute_s == Approx(0.50).epsilon(1e-9));  // steps 101-150, lost
  CHECK(f.checkpoint_stall_s == Approx(0.5));
  REQUIRE(g.restarts().size() == 1);
  CHECK(g.restarts()[0].reached_step == 150);
  CHECK(g.restarts()[0].resumed_step == 100);
  g.finish(/*done=*/true);
  CHECK(slurp(path).find("state = \"done\"") != std::string::npos);
  // A finished ledger, or another job's, is not continued.
  GoodputLedger next(path, "77", 0);
  next.begin(0);
  CHECK(next.figures().restarts == 0);
  CHECK(next.figures().useful_s == 0);
}

TEST_CASE("goodput: a memory checkpoint's useful time counts the steps the ledger had not written",
          "[goodput]") {
  strata::test::TempDir tmp;
  const std::string path = tmp.path.string() + "/goodput.toml", last = path + ".last";
  double at_150 = 0;
  {
    GoodputLedger g(path, "79", 0);
    g.begin(0);
    for (int s = 1; s <= 100; ++s) g.step_done(s, 0.01);
    g.checkpoint(100, 0.0);  // written: useful 1.0 s at step 100
    fs::copy_file(path, last);
    for (int s = 101; s <= 150; ++s) {  // memory checkpoints every step, between the writes
      g.step_done(s, 0.01);
      g.checkpoint(s, 0.0, /*write_now=*/false);
    }
    at_150 = g.useful_s();
  }
  CHECK(at_150 == Approx(1.5).epsilon(1e-9));
  // The attempt died before its next write: the file is the one of step 100.
  const auto restart = [&](int64_t step, double useful) {
    fs::copy_file(last, path, fs::copy_options::overwrite_existing);
    GoodputLedger g(path, "79", 0);
    g.begin(step, "memory", useful);
    return g.figures();
  };
  auto f = restart(150, at_150);
  CHECK(f.useful_s == Approx(1.5).epsilon(1e-9));  // steps 101-150 were kept, not lost
  CHECK(f.recompute_s == 0);
  // A checkpoint older than the ledger's last write: the steps after it are recomputed.
  f = restart(80, 0.8);
  CHECK(f.useful_s == Approx(0.8).epsilon(1e-9));
  CHECK(f.recompute_s == Approx(0.2).epsilon(1e-9));
  // Without the checkpoint's figure, the ledger knows no more than its last write.
  f = restart(150, -1);
  CHECK(f.useful_s == Approx(1.0).epsilon(1e-9));
}

TEST_CASE("goodput: restores from memory and from files are counted apart", "[goodput]") {
  strata::test::TempDir tmp;
  const std::string path = tmp.path.string() + "/goodput.toml";
  const char* sources[] = {"", "memory", "file", "memory"};
  for (int attempt = 0; attempt < 4; ++attempt) {
    GoodputLedger g(path, "78", 0);
    g.begin(attempt * 10, sources[attempt]);
    g.step_done(attempt * 10 + 10, 0.1);
    g.checkpoint(attempt * 10 + 10, 0.01);
  }
  GoodputLedger g(path, "78", 0);
  const auto f = g.figures();
  CHECK(f.restarts == 3);
  CHECK(f.restores_memory == 2);
  CHECK(f.restores_file == 1);
  REQUIRE(g.restarts().size() == 3);
  CHECK(g.restarts()[0].source == "memory");
  CHECK(g.restarts()[1].source == "file");
  CHECK(strata::describe_goodput(f).ends_with("; 3 restarts: 2 from memory, 1 from files)"));
}

TEST_CASE("goodput: another job or a damaged ledger starts afresh", "[goodput]") {
  strata::test::TempDir tmp;
  const std::string dir = tmp.path.string(), path = dir + "/goodput.toml";
  {
    GoodputLedger g(path, "1", 0);
    g.begin(0);
    g.step_done(10, 2.0);
  }
  GoodputLedger other(path, "2", 0);
  other.begin(10);
  CHECK(other.figures().restarts == 0);
  CHECK(other.figures().useful_s == 0);
  std::ofstream(path) << "version = [\n";  // not TOML
  GoodputLedger damaged(path, "2", 0);
  damaged.begin(0);
  CHECK(damaged.figures().restarts == 0);
}

TEST_CASE("prometheus: one text file, every series labelled, written atomically", "[prometheus]") {
  strata::test::TempDir tmp;
  const std::string dir = tmp.path.string(), path = dir + "/x.prom";
  strata::PrometheusFile p(path, "123", "run \"a\"\\b");
  strata::TrainingGauges g;
  g.step = 7;
  g.loss = 0.25;
  g.progress_age_s = -1;  // watchdog off: no series
  g.goodput.restores_memory = 4;
  g.goodput.restores_file = 1;
  p.note_checkpoint(5, 1.5, 0.01, 4096);
  p.write(g);
  const std::string text = slurp(path);
  CHECK(text.find("strata_step{slurm_job_id=\"123\",run=\"run \\\"a\\\"\\\\b\"} 7\n") != std::string::npos);
  CHECK(text.find("strata_checkpoint_bytes{") != std::string::npos);
  CHECK(text.find("cause=\"restart_gap\"") != std::string::npos);
  CHECK(text.find("strata_job_restores{slurm_job_id=\"123\",run=\"run \\\"a\\\"\\\\b\",source=\"memory\"} 4\n") !=
        std::string::npos);
  CHECK(text.find(",source=\"file\"} 1\n") != std::string::npos);
  CHECK(text.find("strata_watchdog_progress_age_seconds") == std::string::npos);
  // A checkpoint finished after the last update (drained at run end) rewrites the file.
  p.note_checkpoint(9, 2.0, 0.02, 8192);
  CHECK(slurp(path).find("strata_checkpoint_step{slurm_job_id=\"123\",run=\"run \\\"a\\\"\\\\b\"} 9\n") !=
        std::string::npos);
  CHECK(slurp(path).find("strata_step{slurm_job_id=\"123\",run=\"run \\\"a\\\"\\\\b\"} 7\n") !=
        std::string::npos);
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename());
  CHECK(files == std::set<std::string>{"x.prom"});
  CHECK(strata::run_name_of("runs/fmnist_cnn/") == "fmnist_cnn");
  CHECK(strata::test::user_error([&] { strata::PrometheusFile(dir + "/x.txt", "", ""); })
            .find("must end in .prom") != std::string::npos);
}

TEST_CASE("local cache: copies are verified, the copier publishes the newest", "[checkpoint]") {
  strata::test::TempDir tmp;
  const std::string dir = tmp.path.string();
  fs::create_directories(dir + "/local");
  fs::create_directories(dir + "/shared");
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 2654435761u >> 13);
  std::ofstream(dir + "/local/a") << big;
  int64_t bytes = 0;
  CHECK(strata::copy_verified(dir + "/local/a", dir + "/shared/a", &bytes).empty());
  CHECK(bytes == int64_t(big.size()));
  CHECK(slurp(dir + "/shared/a") == big);
  // The destination must be new: never overwrite a file in place.
  CHECK(strata::copy_verified(dir + "/local/a", dir + "/shared/a", &bytes).find("cannot create") == 0);
  CHECK(strata::copy_verified(dir + "/local/none", dir + "/shared/b", &bytes).find("cannot open") == 0);

  std::vector<int64_t> published;
  {
    strata::SharedCopier c(dir + "/shared", [&](const std::string& name, int64_t step) {
      published.push_back(step);
      CHECK(fs::exists(dir + "/shared/" + name));
    });
    for (int s = 1; s <= 5; ++s) {
      std::ofstream(dir + "/local/ckpt-" + std::to_string(s)) << big << s;
      c.submit(dir + "/local/ckpt-" + std::to_string(s), "ckpt-" + std::to_string(s), s);
    }
    CHECK(c.drain().empty());
    c.submit(dir + "/local/missing", "ckpt-6", 6);
    const auto failed = c.drain();
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].find("cannot open") != std::string::npos);
  }
  // Copies run one at a time; a checkpoint waiting is replaced by a newer one, so 5 is last.
  REQUIRE(!published.empty());
  CHECK(published.back() == 5);
  CHECK(std::is_sorted(published.begin(), published.end()));
  CHECK(slurp(dir + "/shared/ckpt-5") == big + "5");
}
