// Where a token split's tokens come from, whatever the file holding them: "how many, and tokens
// [a, b) at their stored width". The Loader cuts its windows from this alone, so windowing,
// shuffling, the in-memory cache and streaming are one code path for HDF5 token files and
// token shards, and the same tokens give the same batches, bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/data.h"

namespace strata {

// Token ranges [first, last) of a split, read one after the other.
using TokenRanges = std::vector<std::pair<int64_t, int64_t>>;

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Bytes per stored token: 1, 2 or 4 (uint8, uint16, int32).
  virtual size_t token_bytes() const = 0;
  // Reads every range of `ranges`, in order and back to back, into dst at the stored width
  // (dst holds sum(last - first) * token_bytes() bytes). A file that cannot be read, or that
  // changed since it was opened, throws UserError naming it.
  virtual void read(const TokenRanges& ranges, unsigned char* dst) = 0;
  // Token i of the split, for messages: "f.h5: /train/tokens[i]", "f.bin: token at byte N".
  // Answers after close() too.
  virtual std::string where(int64_t i) const = 0;
  // Closes the files, once the split was read whole; read() may not be called after it.
  virtual void close() = 0;
};

// Opens split `s` of `info` (from open_dataset) for reading: its HDF5 dataset
// (hdf5_token_source.cpp) or its shards (shard_source.cpp).
std::unique_ptr<TokenSource> open_token_source(const DatasetInfo& info, const SplitInfo& s);
std::unique_ptr<TokenSource> open_hdf5_tokens(const DatasetInfo& info, const SplitInfo& s);
std::unique_ptr<TokenSource> open_shard_tokens(const DatasetInfo& info, const SplitInfo& s);

}  // namespace strata
