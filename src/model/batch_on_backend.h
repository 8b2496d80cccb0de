// A batch where the backend computes: the loader's own buffers on the CPU, else copies
// uploaded into buffers kept from batch to batch (training and evaluation).
#pragma once
#include <cstdint>

#include "data/data.h"
#include "strata/backend.h"

namespace strata {

class BatchOnBackend {
 public:
  struct View {
    const Tensor& x;
    const int32_t* y;
  };
  View put(const Backend& be, const Loader::Batch& b) {
    if (be.host_memory()) return {b.x, b.y.data()};
    x_.resize(b.x.shape, *be.memory);
    be.upload(x_.data(), b.x.data(), sizeof(float) * size_t(b.x.size()));
    y_.resize({int64_t(b.y.size())}, *be.memory);
    be.upload(y_.i32(), b.y.data(), sizeof(int32_t) * b.y.size());
    return {x_, y_.i32()};
  }

 private:
  Tensor x_, y_;  // y_ holds int32 labels
};

}  // namespace strata
