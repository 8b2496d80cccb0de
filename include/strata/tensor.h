// A dense, row-major fp32 tensor, in 256-byte aligned host memory or in a device backend's
// memory (Memory says which; only host memory may be read or written by host code).
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

// Where a tensor's bytes live. Backends own one each (backend.h); host_memory() is the CPU's.
struct Memory {
  const char* name;  // "host", "cuda"
  bool host;         // host code may dereference these pointers
  void* (*alloc)(size_t bytes);  // zero-filled; throws std::bad_alloc or std::runtime_error
  void (*release)(void* p);
  void (*zero)(void* p, size_t bytes);
};
const Memory& host_memory();

// Allocations and frees of device (non-host) memory made by tensors since the process began:
// a training step in steady state makes none (a GPU's cudaFree waits for the whole device).
struct DeviceAllocations {
  int64_t allocs = 0, frees = 0;
};
DeviceAllocations device_allocations();

struct Tensor {
  Shape shape;
  std::shared_ptr<float[]> storage;  // owned, 256-byte aligned; may be shared by views
  float* ptr = nullptr;              // first element (views point into someone's storage)
  int64_t capacity = 0;              // elements owned by storage (0 for views)
  const Memory* memory = &host_memory();

  Tensor() = default;
  explicit Tensor(Shape s, const Memory& m = host_memory());  // zero-filled
  // Non-owning view of memory m (a view's owner must outlive it).
  static Tensor view(float* p, Shape s, const Memory& m = host_memory());
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
  // The same in memory m: a tensor in other memory (or none yet) is reallocated there.
  void resize(Shape s, const Memory& m);
  // The buffer as int32 (argmax, labels): same element size, storage only ever read as int32.
  int32_t* i32() { return reinterpret_cast<int32_t*>(ptr); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(ptr); }
};

}  // namespace strata
