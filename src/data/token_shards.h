// Token shards read in place (docs/models-and-data.md, "Data format"):
//   llm.c:   a header of 256 little-endian int32 (magic 20240520, version 1, token count, the
//            rest unused), then the tokens as uint16; file size = 1024 + 2 * count.
//   nanoGPT: train.bin / val.bin, uint16 tokens and nothing else (an even, non-zero size).
// data.path names one file, a TOML list of files ("[\"a.bin\", \"b.bin\"]") or a glob
// ("dir/*_train_*.bin", sorted by name); the files of a split form one token stream in that
// order. data.format = "auto" tells the format from each file: the HDF5 signature, then the
// llm.c magic, then the name train.bin / val.bin (nanoGPT); one format per path.
// The validation split: data.val_path (the same forms), else the same path with the last
// "train" of its file name read as "val" (fineweb_train_*.bin -> fineweb_val_*.bin,
// train.bin -> val.bin) when that names files. The vocabulary: model.vocab, else GPT-2's 50257.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data.h"

namespace strata {

constexpr int32_t kLlmcShardMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 1024;
constexpr int kGpt2Vocab = 50257;

// The files `path` names (one file, a TOML list, or a glob matched in sorted order); a glob
// that matches nothing is a UserError naming it.
std::vector<std::string> data_files(const std::string& path, const std::string& key);

// "hdf5", "llmc" or "nanogpt": what data.format says, or for "auto" what `files` hold (all the
// same format, else a UserError naming two that differ).
std::string data_format(const std::vector<std::string>& files, const std::string& format,
                        const std::string& key);

// Bytes before the first token of a shard of `format` ("llmc" 1024, "nanogpt" 0).
int64_t shard_header_bytes(const std::string& format);

// Token shards at `path` (format "llmc" or "nanogpt"), validated: headers, sizes, and every
// token below the vocabulary (a scan over all cores), each failure a UserError naming the file
// (and the byte of a bad token).
DatasetInfo open_token_shards(const std::string& path, const std::string& format,
                              const DataOptions& options);

// Checks every token of `files` (shards of `format`, `tokens` each) is below `vocab`, reading
// them in parallel in chunks (this process: chunks i with i % parts == part); throws
// UserError naming the first bad token's file and byte.
void check_shard_tokens(const std::vector<std::string>& files, const std::vector<int64_t>& tokens,
                        const std::string& format, int64_t vocab, int part, int parts);

}  // namespace strata
