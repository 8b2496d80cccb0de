#include "strata/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

namespace strata {

Shape batched(int64_t b, const Shape& sample) {
  Shape s = sample;
  s.insert(s.begin(), b);
  return s;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

static std::shared_ptr<float[]> alloc_aligned(int64_t n) {
  size_t bytes = (size_t(n) * sizeof(float) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return std::shared_ptr<float[]>(static_cast<float*>(p), [](float* q) { std::free(q); });
}

Tensor::Tensor(Shape s) : shape(std::move(s)) {
  capacity = numel(shape);
  storage = alloc_aligned(capacity);
  ptr = storage.get();
}

Tensor Tensor::view(float* p, Shape s) {
  Tensor t;
  t.shape = std::move(s);
  t.ptr = p;
  return t;
}

void Tensor::zero() { std::memset(ptr, 0, sizeof(float) * size()); }

void Tensor::resize(Shape s) {
  int64_t n = numel(s);
  if (!storage || n > capacity) {
    capacity = n;
    storage = alloc_aligned(n);
    ptr = storage.get();
  }
  shape = std::move(s);
}

}  // namespace strata
