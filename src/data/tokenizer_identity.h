// Which tokenizer made a token file, recorded in it and carried into every checkpoint and
// parameter file trained on it, so `strata generate` decodes with the same one
// (docs/models-and-data.md, "GPT-2's tokenizer").
//
// The contract, root attributes of token, checkpoint and parameter files (exact names):
//   tokenizer                    "bytes" or "gpt2"; absent means bytes
//   tokenizer_vocab              gpt2: the vocabulary directory, absolute
//   tokenizer_sha256_<basename>  gpt2: the SHA-256 of each of its two files
//                                (tokenizer_sha256_encoder.json, tokenizer_sha256_vocab.bpe)
#pragma once
#include <hdf5.h>

#include <map>
#include <string>

#include "data/gpt2_tokenizer.h"

namespace strata {

// Root attribute name -> value; only the names above. Empty: bytes, nothing recorded.
using TokenizerAttrs = std::map<std::string, std::string>;

// The attributes of a GPT-2 vocabulary read from dir (hashes its two files).
TokenizerAttrs gpt2_tokenizer_attrs(const Gpt2Tokenizer& t, const std::string& dir);

// "bytes" when attrs has no tokenizer.
std::string tokenizer_name(const TokenizerAttrs& attrs);

// Writes attrs as string attributes of obj (an HDF5 file or group); reads them back (the
// attributes named above that obj has). HDF5 calls: the caller holds hdf5_mutex() if needed.
void write_tokenizer_attrs(hid_t obj, const TokenizerAttrs& attrs);
TokenizerAttrs read_tokenizer_attrs(hid_t obj);

// Every recorded tokenizer_sha256_<name> must match the file `name` in dir; UserError naming
// that file and `file` (the model or token file that records it), ending in "; HINT" if given.
void check_recorded_files(const TokenizerAttrs& attrs, const std::string& dir, const std::string& file,
                          const std::string& hint);

// The GPT-2 tokenizer that `file` (a model or token file) records: from vocab_dir if given,
// else from its tokenizer_vocab; every recorded tokenizer_sha256_* must match the file of that
// name in the directory. UserError naming the directory, the file and the model at fault
// (the vocabulary moved: name it with --vocab).
Gpt2Tokenizer load_recorded_gpt2(const TokenizerAttrs& attrs, const std::string& vocab_dir,
                                 const std::string& file);

}  // namespace strata
