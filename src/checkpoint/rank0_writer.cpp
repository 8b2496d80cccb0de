// The rank0 writer (writer.h): the whole model and its unsharded optimizer state, gathered on
// rank 0, written by rank 0 alone with its train state and provenance. The tensors may be a
// snapshot (Checkpointer::save writes periodic checkpoints in the background from one).
#include <memory>

#include "checkpoint/checkpoint_write.h"
#include "checkpoint/writer.h"

namespace strata {
namespace {

class Rank0Writer final : public CheckpointWriter {
 public:
  CheckpointWriterKind kind() const override { return CheckpointWriterKind::kRank0; }
  bool every_rank_writes() const override { return false; }
  int64_t write(const std::string& path, const CheckpointContent& c) override {
    return write_atomically(path, c.tensors,
                            [&](hid_t f) { write_checkpoint_attrs(f, c.model, c.state, c.prov); });
  }
};

}  // namespace

std::unique_ptr<CheckpointWriter> make_rank0_writer() { return std::make_unique<Rank0Writer>(); }

}  // namespace strata
