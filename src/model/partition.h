// A pipeline stage's share of the layer stack: its chunks (layer ranges; one per stage, or
// several on an interleaved pipeline's stage), where each chunk's layers sit in the stage's
// own list, and where each chunk's parameters sit in the whole model's flat layout. Pipeline
// stages, whole-model assembly, sharded checkpoints and ZeRO read it.
#pragma once
#include <cstdint>
#include <vector>

#include "model/layer_stack.h"

namespace strata {

// An interleaved pipeline's P stages hold P v virtual stages (ranges, in layer order): stage s
// the chunks s, s + P, ..., s + (v-1) P. Without interleaving (v = 1) one range each.
std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& virtual_ranges, int stages,
                                     int stage);

// Where a chunk's parameters sit in the whole model's flat buffers (later layers first;
// offsets count whole tensors): its offset in the stage's unsplit block (what assemble writes
// and extract read: the chunks' blocks one after the other), its offset in the whole model,
// and its length.
struct Segment {
  int64_t block_offset, whole_offset, count;
};

class Partition {
 public:
  Partition() = default;
  // ranges: in layer order, not overlapping (last = -1: to the end); whole_flat[i]: the floats
  // layer i of the whole stack spans unsplit (whole_flat_count).
  Partition(std::vector<LayerRange> ranges, const std::vector<int64_t>& whole_flat);

  int chunks() const { return int(ranges_.size()); }
  // Chunk c's layers in the whole stack, and in the stage's own list [begin, end).
  const LayerRange& range(int c) const { return ranges_[size_t(c)]; }
  int begin(int c) const { return begin_[size_t(c)]; }
  int end(int c) const { return begin_[size_t(c) + 1]; }
  int layers() const { return begin_.back(); }
  // Whether layer i of the whole stack is on this stage.
  bool holds(int i) const { return here_[size_t(i)]; }
  // Whether chunk c sends a gradient to the stage before (it does not start the model).
  bool needs_input_grad(int c) const { return range(c).first > 0; }
  // Per chunk, last chunk first (the flat layout's order).
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  std::vector<LayerRange> ranges_;
  std::vector<int> begin_;
  std::vector<bool> here_;
  std::vector<Segment> segments_;
};

}  // namespace strata
