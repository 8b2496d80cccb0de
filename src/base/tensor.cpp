#include "strata/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "base/memory.h"

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

namespace {
// 256-byte aligned, as a GPU allocator's: with the flat buffers' padding, every tensor in
// them then starts on a 256-byte boundary in host memory too.
void* host_alloc(size_t bytes) {
  bytes = (bytes + 255) / 256 * 256;
  if (bytes == 0) bytes = 256;
  check_allocation(bytes);
  void* p = std::aligned_alloc(256, bytes);
  if (!p) throw OutOfMemory(bytes);
  std::memset(p, 0, bytes);
  return p;
}
void host_release(void* p) { std::free(p); }
void host_zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }

std::atomic<int64_t> g_device_allocs{0}, g_device_frees{0};

std::shared_ptr<float[]> allocate(const Memory& m, int64_t n) {
  void* p = m.alloc(size_t(n) * sizeof(float));
  if (m.host) return std::shared_ptr<float[]>(static_cast<float*>(p), [rel = m.release](float* q) { rel(q); });
  g_device_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<float[]>(static_cast<float*>(p), [rel = m.release](float* q) {
    g_device_frees.fetch_add(1, std::memory_order_relaxed);
    rel(q);
  });
}
}  // namespace

DeviceAllocations device_allocations() {
  return {g_device_allocs.load(std::memory_order_relaxed), g_device_frees.load(std::memory_order_relaxed)};
}

const Memory& host_memory() {
  static const Memory m{.name = "host", .host = true, .alloc = host_alloc,
                        .release = host_release, .zero = host_zero};
  return m;
}

Tensor::Tensor(Shape s, const Memory& m) : shape(std::move(s)), memory(&m) {
  capacity = numel(shape);
  storage = allocate(m, capacity);
  ptr = storage.get();
}

Tensor Tensor::view(float* p, Shape s, const Memory& m) {
  Tensor t;
  t.shape = std::move(s);
  t.ptr = p;
  t.memory = &m;
  return t;
}

void Tensor::zero() { memory->zero(ptr, sizeof(float) * size_t(size())); }

void Tensor::resize(Shape s) {
  int64_t n = numel(s);
  if (!storage || n > capacity) {
    capacity = n;
    storage = allocate(*memory, n);
    ptr = storage.get();
  }
  shape = std::move(s);
}

void Tensor::resize(Shape s, const Memory& m) {
  if (memory != &m) {  // a view (no storage) is re-pointed at memory of its own, too
    storage.reset();
    memory = &m;
  }
  resize(std::move(s));
}

}  // namespace strata
