// Converting Fashion-MNIST (gzip'ed IDX files), and text files for language models, into the
// HDF5 layouts of data.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
// t10k-labels-idx1-ubyte.gz from source_dir and writes out_path:
//   /train/images, /test/images  uint8 (N, H, W), contiguous; attributes height, width, channels
//   /train/labels, /test/labels  uint8 (N,)
//   root attributes: classes = 10, source, created_by ("strata <version>"), created_at (UTC,
//   ISO 8601), sha256_<file> for each source file, and source_sha256: the SHA-256 of the text
//   `sha256sum` prints for the four files in the order above ("<hex>  <name>\n" each), i.e.
//   the digest printed by (in SOURCE_DIR, on one line)
//     sha256sum train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
//               t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz | sha256sum
// Everything is read and checked before writing; the file is written to "<out>.tmp.<pid>" and
// renamed over out_path, so out_path never holds a partial file. Throws UserError naming the
// file at fault (missing, truncated, bad IDX header, inconsistent counts, no output directory).
// Runs on one rank.
void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_path);

// Each split of a prepared text file must hold at least this many tokens: enough for a model
// with a context of up to 1024 tokens (a window is context + 1 tokens).
constexpr int64_t kMinTextSplitTokens = 1025;

struct PreparedText {
  int64_t train_tokens = 0, val_tokens = 0;
  int vocab = 0;
  double unigram_entropy_nats = 0;
  int threads = 1;  // that encoded the text (gpt2)
};

// Which tokenizer `strata prepare text` uses.
struct TextTokenizer {
  std::string name = "bytes";  // bytes | gpt2
  std::string vocab_dir;       // gpt2: encoder.json + vocab.bpe, or vocab.json + merges.txt
  int threads = 0;             // gpt2: encoding threads; 0 = every core this process may use
};

// `strata prepare text`: text files -> token file (data.h) with the built-in byte-level
// tokenizer: token = byte value, vocab 256, nothing to download or train.
// The bytes are used exactly as they are (no decoding, no normalisation, no separators added
// or removed; the "%" lines between Debian's fortunes stay in). Split: the validation split is
// the last round(val_fraction * size) bytes of each input, the training split the rest; each
// split is its inputs' parts in input order. So train + val hold every byte of the inputs, and
// every input (a topic, for the fortunes) is in both splits rather than the last inputs being
// validation only. (With one input: val is its tail; `tail -c K FILE` reproduces it.)
// Writes
//   /train/tokens, /val/tokens  uint8 (N,), contiguous
//   root attributes: kind = "tokens", vocab = 256, tokenizer = "bytes", train_tokens,
//   val_tokens, val_fraction, unigram_entropy_nats (entropy of the train split's byte
//   frequencies, in nats per token: the loss of a model that knows only those frequencies),
//   source (the input paths), created_by, created_at, sha256_<basename> per input, and
//   source_sha256: the SHA-256 of the `sha256sum`-style lines "<hex>  <basename>\n" of the
//   inputs in input order, i.e. for inputs in one directory the digest printed by (there)
//     sha256sum NAME... | sha256sum
// Throws UserError naming the file at fault: an input missing, unreadable, a directory or
// empty; two inputs with the same basename (their sha256_ attributes would collide);
// val_fraction outside (0, 1); a split under kMinTextSplitTokens tokens; no output directory.
// Inputs are read whole into memory. Written to "<out>.tmp.<pid>" and renamed over out_path,
// like prepare_fashion_mnist. Runs on one rank.
//
// With tokenizer.name = "gpt2": GPT-2's BPE (gpt2_tokenizer.h) from tokenizer.vocab_dir. Each
// input is one document, encoded on tokenizer.threads threads (a progress bar on stderr for
// inputs over 8 MiB); the validation split is the last round(val_fraction * n) tokens of each
// document's n; in each split the documents' parts are joined with <|endoftext|> (50256)
// between them (none before the first or after the last). So decoding a split gives the
// inputs' bytes with "<|endoftext|>" between documents. The tokens are uint16, vocab = 50257
// (the vocabulary's size), tokenizer = "gpt2", and the vocabulary's identity is recorded
// (tokenizer_identity.h: tokenizer_vocab, tokenizer_sha256_<file>); unigram_entropy_nats is
// over token frequencies. UserError also for an unknown tokenizer name, gpt2 without a
// vocab_dir, a vocab_dir with bytes, and any fault of the vocabulary's files.
PreparedText prepare_text(const std::vector<std::string>& inputs, const std::string& out_path,
                          double val_fraction = 0.1, const TextTokenizer& tokenizer = {});

// Lower-case hex SHA-256 of a file's bytes. Throws UserError if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace strata
