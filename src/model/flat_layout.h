// The flat parameter layout: a stage's parameters and gradients in two flat buffers (one
// allocation, one optimizer call, contiguous allreduce buckets), last layer first so that
// backward finishes gradients front to back, every tensor on a 256-byte boundary (flat_span).
// Beside it, two other views of the same tensors: the packed layout (back to back, no
// padding: the gradient norm's order, what ZeRO's shards split) and the stage's unsplit block
// (every tensor-parallel part put together: what checkpoints hold).
#pragma once
#include <memory>
#include <vector>

#include "model/layers.h"
#include "strata/backend.h"

namespace strata {

class FlatLayout {
 public:
  FlatLayout() = default;
  // Binds the parameters of `layers` (naming each "layer.param"), the last layer's first,
  // then `extra` (the tied token table's copy, or null) after the block.
  FlatLayout(std::vector<std::unique_ptr<Layer>>& layers, Param* extra, TensorSplit tp);

  // Parameters in forward (layer) order, `extra` last.
  const std::vector<Param*>& params() const { return params_; }
  // The flat buffers the backend computes on (the optimizer, allreduce and layers use these).
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  const Tensor& grads() const { return grads_; }
  // The host copy of values(): what checkpoints, parameter files and stage gathering read and
  // write. The same storage as values() until place() moves those to a device.
  Tensor& host_values() { return host_values_; }
  int64_t num_params() const { return values_.size(); }  // everything the optimizer updates
  // The prefix of grads() complete once layer i's backward has run.
  int64_t ready_after(size_t i) const { return ready_after_[i]; }

  // The stage's block of the whole model: block_params() floats from 0 (this rank's parts of
  // split parameters); whole_block_params() its size unsplit, as checkpoints hold it. After
  // the block: `extra`.
  int64_t block_params() const { return block_params_; }
  int64_t whole_block_params() const { return whole_block_params_; }
  // The unsplit block from every tensor rank's flat buffer (parts[t]: rank t's), and this
  // rank's part of an unsplit block.
  void assemble(const std::vector<const float*>& parts, float* whole) const;
  void extract(const float* whole, float* mine) const;

  // The ranges of the flat buffers whose squares this rank adds to the global gradient norm,
  // each the pieces of one range of the packed layout: a parameter every tensor rank holds
  // whole is counted by rank 0, `extra` not at all.
  std::vector<FlatPieces> norm_ranges() const;
  // The packed layout: its size, the flat index of packed index k (a boundary between tensors
  // maps to the next one's start; the size to num_params()), and packed shard sizes
  // (zero_counts) as flat shard sizes.
  int64_t packed_params() const { return packed_params_; }
  int64_t flat_index(int64_t k) const;
  std::vector<int64_t> flat_counts(const std::vector<int64_t>& packed_counts) const;

  // PyTorch's default initialisation (uniform ±1/sqrt(fan_in) for weights and biases), each
  // tensor seeded by (seed, name): independent of rank count and layer order. Into
  // host_values(); on a device, place() or push() uploads them.
  void init(uint64_t seed);
  // Puts values and gradients in the backend's memory, uploading host_values(); a no-op for
  // host memory.
  void place(const Backend& be);
  // Host memory only: values (and host values) from now on in `v` (num_params() floats on a
  // 256-byte boundary, a view or owned: a memory checkpoint's generation the optimizer wrote,
  // run/memory_state.h). Every parameter's pointers follow; the old buffer is left as it is.
  void rebind_values(Tensor v);
  // The same for the gradients (num_params() floats on a 256-byte boundary): the next
  // generation's state the update writes over its gradient (run/update_generations.h).
  // Whatever held them is left as it is: backward writes every gradient before it is read, and
  // the padding between tensors, which no kernel writes, is zero in `g` as in the buffer it
  // replaces (a generation's state's padding stays zero: the updates keep it so).
  void rebind_grads(Tensor g);
  // host_values() <- values() (before a checkpoint or parameter file), and the reverse.
  void pull(const Backend& be);
  void push(const Backend& be);

 private:
  TensorSplit tp_;
  const Param* extra_ = nullptr;
  int64_t block_params_ = 0, whole_block_params_ = 0, packed_params_ = 0;
  std::vector<Param*> params_;
  std::vector<const Param*> by_packed_;  // in packed (= flat) order
  std::vector<int64_t> ready_after_;
  Tensor values_, grads_, host_values_;
};

}  // namespace strata
