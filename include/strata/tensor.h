// A dense, row-major fp32 tensor in 64-byte aligned host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);  // "(64, 1, 28, 28)"
Shape batched(int64_t b, const Shape& sample);  // (b, sample...)

struct Tensor {
  Shape shape;
  std::shared_ptr<float[]> storage;  // owned, 64-byte aligned; may be shared by views
  float* ptr = nullptr;              // first element (views point into someone's storage)
  int64_t capacity = 0;              // elements owned by storage (0 for views)

  Tensor() = default;
  explicit Tensor(Shape s);                           // zero-filled
  static Tensor view(float* p, Shape s);              // non-owning view
  int64_t size() const { return numel(shape); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int rank() const { return int(shape.size()); }
  float* data() { return ptr; }
  const float* data() const { return ptr; }
  float& operator[](int64_t i) { return ptr[i]; }
  float operator[](int64_t i) const { return ptr[i]; }
  void zero();
  // Reallocates only when the element count grows; keeps views of this tensor valid otherwise.
  void resize(Shape s);
};

}  // namespace strata
