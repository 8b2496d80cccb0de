// The checkpoint seam (checkpoint/writer.h): the run's writer chosen once with its reason, and
// each writer's file read back by the one reader.
#include <catch2/catch.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/writer.h"
#include "model/model.h"
#include "model/optim.h"
#include "test_util.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("checkpoint writer: chosen once, with the reason", "[checkpoint]") {
  auto single = make_single_comm();  // no MPI communicator
  RunConfig c;
  c.parallel.zero = 1;
  auto w = choose_checkpoint_writer(c, 1, *single);
  CHECK(w.kind == CheckpointWriterKind::kRank0);
  CHECK(w.why.find("no MPI communicator") != std::string::npos);
  c.checkpoint.writer = "parallel";
  CHECK(user_error([&] { choose_checkpoint_writer(c, 1, *single); })
            .find("checkpoint.writer = parallel: no MPI communicator") != std::string::npos);
  c.checkpoint.writer = "auto";
  c.parallel.zero = 0;
  CHECK(choose_checkpoint_writer(c, 1, *single).why.find("parallel.zero = 0") != std::string::npos);
  c.parallel.zero = 1;
  CHECK(choose_checkpoint_writer(c, 2, *single).why.find("tensor parts") != std::string::npos);
  for (auto k : {CheckpointWriterKind::kRank0, CheckpointWriterKind::kParallel, CheckpointWriterKind::kInt8})
    CHECK(std::string(checkpoint_writer_name(k)) != "?");
}

TEST_CASE("checkpoint writer: rank0's file reads back, state and tensors bit for bit", "[checkpoint]") {
  TempDir dir;
  Model model({"flatten", "linear 5", "relu", "linear 3"}, {2, 2}, 3);
  model.init(7);
  Optimizer opt(OptimConfig{.kind = "adamw"}, model.num_params());
  auto tensors = model_tensors(model);
  for (auto& [name, t] : opt.state())
    for (const Param* p : model.params())
      tensors.push_back({"/optimizer/" + name + param_path(p->name).substr(7), p->shape, t->data() + p->offset});
  auto writer = make_checkpoint_writer(CheckpointWriterKind::kRank0, nullptr);
  CHECK_FALSE(writer->every_rank_writes());
  const std::string path = dir.file("ckpt-000000003.h5");
  const int64_t bytes = writer->write(path, {.model = model, .opt = &opt, .tensors = tensors,
                                             .state = {.step = 3, .sequence = 1, .global_batch = 8,
                                                       .optimizer = "adamw"}});
  CHECK(bytes > 0);
  const LoadedCheckpoint ck = read_checkpoint(path);
  CHECK(ck.format == "strata-checkpoint");
  CHECK(ck.state.step == 3);
  for (const Param* p : model.params()) {
    const auto& v = ck.tensors.at(param_path(p->name));
    CHECK(std::equal(v.begin(), v.end(), p->host));
  }
}
