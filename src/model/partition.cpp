#include "model/partition.h"

#include "strata/error.h"

namespace strata {

std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& virtual_ranges, int stages,
                                     int stage) {
  std::vector<LayerRange> out;
  for (size_t k = size_t(stage); k < virtual_ranges.size(); k += size_t(stages)) out.push_back(virtual_ranges[k]);
  return out;
}

Partition::Partition(std::vector<LayerRange> ranges, const std::vector<int64_t>& whole_flat)
    : ranges_(std::move(ranges)) {
  const int total = int(whole_flat.size());
  STRATA_CHECK(!ranges_.empty(), "a model with no layers");
  here_.assign(size_t(total), false);
  int prev_last = 0;
  begin_.push_back(0);
  for (LayerRange& r : ranges_) {
    if (r.last < 0) r.last = total;
    STRATA_CHECK(prev_last <= r.first && r.first < r.last && r.last <= total,
                 "layer ranges [{}, {}) after {} of a {}-layer model", r.first, r.last, prev_last, total);
    prev_last = r.last;
    for (int i = r.first; i < r.last; ++i) here_[size_t(i)] = true;
    begin_.push_back(begin_.back() + r.last - r.first);
  }
  // Each chunk's block in the whole model: the parameters of the layers after it come first.
  int64_t block_at = 0;
  for (size_t c = ranges_.size(); c-- > 0;) {
    Segment g{.block_offset = block_at, .whole_offset = 0, .count = 0};
    for (int i = ranges_[c].last; i < total; ++i) g.whole_offset += whole_flat[size_t(i)];
    for (int i = ranges_[c].first; i < ranges_[c].last; ++i) g.count += whole_flat[size_t(i)];
    segments_.push_back(g);
    block_at += g.count;
  }
}

}  // namespace strata
