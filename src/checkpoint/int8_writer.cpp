// The int8 writer (writer.h): an int8 parameter file (strata quantize): the model's tensors
// less the weights its int8 products replace, the products' float tensors (scales) and their
// int8 data (int8_format.cpp has the layout).
#include <memory>

#include "checkpoint/checkpoint_write.h"
#include "checkpoint/writer.h"
#include "data/tokenizer_identity.h"
#include "strata/error.h"

namespace strata {
namespace {

class Int8Writer final : public CheckpointWriter {
 public:
  CheckpointWriterKind kind() const override { return CheckpointWriterKind::kInt8; }
  bool every_rank_writes() const override { return false; }
  int64_t write(const std::string& path, const CheckpointContent& c) override {
    STRATA_CHECK(c.int8, "an int8 file needs its products");
    const Int8Table& table = *c.int8;
    std::vector<NamedTensor> tensors;
    for (const NamedTensor& t : model_tensors(c.model)) {
      bool replaced = false;
      for (const auto& [name, w] : table.weights) replaced |= name == w.source && param_path(name) == t.path;
      if (!replaced) tensors.push_back(t);
    }
    for (const NamedTensor& t : int8_float_tensors(table)) tensors.push_back(t);
    return write_atomically(path, tensors, [&](hid_t f) {
      write_model_attrs(f, c.model, kInt8Format);
      write_int_attr(f, "step", c.meta.step);
      write_str_attr(f, "config", c.meta.config_toml);
      write_str_attr(f, "dataset_sha256", c.meta.dataset_sha256);
      write_tokenizer_attrs(f, c.meta.tokenizer);
      write_int8_products(f, table);
    });
  }
};

}  // namespace

std::unique_ptr<CheckpointWriter> make_int8_writer() { return std::make_unique<Int8Writer>(); }

}  // namespace strata
