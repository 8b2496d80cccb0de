// Datasets in HDF5 and the loader that gives each rank its slice of every global batch.
//
// Accepted layouts (docs/models-and-data.md, "Data format"). Images: for each split S in {train, test}
//   /S/images  uint8 or float32, shape (N, H, W) or (N, C, H, W); uint8 is scaled by 1/255
//   /S/labels  uint8, int32 or int64, shape (N,), values in [0, classes)
// Root attribute "classes" (integer) gives the class count; if absent, max(label)+1 of train.
// Tokens (a file with root attribute kind = "tokens", or with /train/tokens), for causal
// language models (strata prepare text writes them):
//   /train/tokens, /val/tokens (optional)  uint8, uint16 or int32, shape (N,), values in
//                                          [0, vocab); contiguous, like images
// Root attribute "vocab" (integer) gives the vocabulary size; if absent, max(train token)+1.
// Optional: unigram_entropy_nats (float), source_sha256. The split the trainer calls "test"
// reads /val/tokens. A token file has no samples until set_context cuts it into windows.
// Token shards (llm.c's, with a 1024-byte header, and nanoGPT's headerless train.bin/val.bin,
// both uint16) are token data too, read in place: token_shards.h.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/tensor.h"

namespace strata {

struct SplitInfo {
  std::string name;      // "train" / "test"
  int64_t n = 0;         // samples (token files: windows, 0 until set_context)
  Shape sample_shape;    // (C, H, W); token files: (T) once set_context(T) ran
  bool images_u8 = true; // else float32
  // Token files only.
  std::string dataset;   // "/train/tokens"; "/val/tokens" for the split named "test";
                         // token shards: "train split" / "val split"
  int64_t tokens = 0;    // tokens in the split
  // Token shards only: the split's files, one token stream in this order, and each one's
  // token count (empty for HDF5).
  std::vector<std::string> files;
  std::vector<int64_t> file_tokens;
};

struct DatasetInfo {
  std::string path;
  int classes = 0;            // token files: = vocab (the logits per position)
  SplitInfo train;
  bool has_test = false;      // token files: /val/tokens exists
  SplitInfo test;
  std::string source_sha256;  // provenance attribute, "" if absent
  // Token files.
  bool tokens = false;
  std::string format = "hdf5";  // token data: hdf5 | llmc | nanogpt (token_shards.h)
  int vocab = 0;
  int64_t context = 0;              // T: set by set_context, 0 until then
  double unigram_entropy_nats = 0;  // root attribute: the loss a model that knows only the
                                    // train split's token frequencies reaches; 0 if absent
  // The tokenizer attributes (tokenizer_identity.h: tokenizer, tokenizer_vocab,
  // tokenizer_sha256_*) as the file has them; empty: bytes, or not recorded.
  std::map<std::string, std::string> tokenizer;
};

// How to read data.path (the config's data.format, data.val_path and model.vocab).
struct DataOptions {
  std::string format = "auto";  // auto | hdf5 | llmc | nanogpt
  std::string val_path;         // token shards' validation split ("" = found beside them)
  int vocab = 0;                // token shards' vocabulary (0 = GPT-2's, 50257)
  // Token shards: this process checks chunks i of the token check with i % check_parts ==
  // check_part (the ranks of a run share it; run it inside collectively()).
  int check_part = 0, check_parts = 1;
};

// Opens and validates the file: datasets present, ranks/dtypes/shapes consistent, and every
// label (or token) in range (read once, tokens in chunks). Throws UserError (kExitBadInput)
// naming the file and dataset at fault. `path` may also name token shards: one file, a TOML
// list of files ("[\"a.bin\", \"b.bin\"]") or a glob (token_shards.h).
DatasetInfo open_dataset(const std::string& path, const DataOptions& options = {});

// Cuts a token file's splits into samples of T = context tokens: sample i of a split is the
// window tokens[i*T, i*T + T + 1) (stride T, so windows overlap by one token), giving
// n = (tokens - 1) / T samples of sample_shape (T); the last tokens - 1 - n*T tokens are
// not used. The Loader then gives x = window[0, T) (the inputs) and y = window[1, T + 1) (the
// next token at each position). Throws UserError naming the file, the split's dataset and
// model.context when a split has fewer than T + 1 tokens, or when the file holds images.
void set_context(DatasetInfo& info, int64_t context);

// The HDF5 build here is not thread-safe, and Loader threads call it in the background: any
// code that calls HDF5 while a Loader may be alive (checkpoints, parameter files) must hold
// this lock around those calls. open_dataset, Loader, prepare_fashion_mnist and prepare_text
// take it.
std::mutex& hdf5_mutex();

// Global order of one epoch: a permutation of [0, n) that depends on (seed, epoch) only.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// Reads this rank's slice of each global batch of a split. Batch i of an epoch covers
// order[i*G, (i+1)*G); rank r of R reads the contiguous part [r*G/R, (r+1)*G/R) of that range.
// A trailing partial batch is dropped when shuffling (training); for evaluation (shuffle=false)
// the last batch is partial and split as evenly as possible.
// Token files (after set_context) are batched the same way, sample = window (see set_context).
// A split whose images fit in STRATA_DATA_CACHE_MB (default 512 MiB per rank) is read whole,
// once, by the constructor; next() then gathers and converts this rank's rows from memory on
// the calling thread (fetching rows a few ahead of the conversion), with no thread and no HDF5
// call.
// A larger split (or STRATA_DATA_CACHE_MB=0) is streamed: a background thread reads the next
// batch from the file while the current one is in use (double buffering); it is the only
// thread that touches HDF5 while a Loader is alive. Both give the same batches.
class Loader {
 public:
  Loader(const DatasetInfo& info, const std::string& split, int64_t global_batch, int rank,
         int ranks, bool shuffle, uint64_t seed);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  // Positions the loader at (epoch, batch); the next call to next() returns that batch.
  void seek(int64_t epoch, int64_t batch);
  struct Batch {
    Tensor x;                     // (b, C, H, W), b = this rank's share; token files:
                                  // (b, T), the input token ids as floats (exact: vocab <= 2^24)
    std::vector<int32_t> y;       // (b) labels; token files: (b*T), y[k*T + t] = the token
                                  // after x[k, t]
    int64_t epoch = 0, index = 0; // which global batch this is
    int64_t first_sample = 0;     // position of this rank's first sample within the global
                                  // batch, r*g/R for a batch of g samples (g = G except in a
                                  // partial evaluation batch); dropout keys its masks on it
  };
  // Returns the next batch (advancing across epoch boundaries). The reference stays valid until
  // the next call.
  const Batch& next();

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace strata
