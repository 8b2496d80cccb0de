// GPT-2's byte-level BPE tokenizer (docs/models-and-data.md, "GPT-2's tokenizer"): the
// vocabulary of OpenAI's encoder.json + vocab.bpe (or Hugging Face's vocab.json + merges.txt),
// encoding exactly as GPT-2's encoder.py does and decoding back to the exact bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// GPT-2's <|endoftext|>: strata puts it between documents.
constexpr int32_t kGpt2EndOfText = 50256;

// The split of text into pre-tokens by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out by hand over UTF-8 (\s = Unicode White_Space, tables in unicode_classes.inc).
// A byte that is not part of valid UTF-8 counts as one character of the class "other" (neither
// letter, number nor space), so any bytes encode and decode back unchanged.
// Calls word(start, length) for each pre-token of `text`, in order; they tile the text.
void gpt2_pretokenize(std::string_view text, const std::function<void(size_t, size_t)>& word);

// The Unicode version of the letter/number/space tables.
const char* gpt2_unicode_version();

class WordCache;  // gpt2_tokenizer.cpp

class Gpt2Tokenizer {
 public:
  // Reads DIR/encoder.json + DIR/vocab.bpe, or else DIR/vocab.json + DIR/merges.txt. A file
  // that is missing, not the JSON object of token -> id, a merge line that is not two tokens
  // of the vocabulary whose concatenation is one too, a duplicate token, id or merge, ids that
  // are not 0..n-1 or a byte without its token: UserError (kExitBadInput) naming the file and
  // line (and column in JSON).
  static Gpt2Tokenizer load(const std::string& dir);

  int vocab_size() const { return int(token_bytes_.size()); }
  // The two files read, as given (dir/name), in the order above.
  const std::vector<std::string>& files() const { return files_; }

  // The token ids of `text` (one document; no <|endoftext|> added). One thread.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same ids as encode, computed by `threads` threads over pieces of the text cut where a
  // pre-token always ends (a '\n' after a printable ASCII character). progress(bytes) is
  // called from the calling thread as pieces finish, with the bytes encoded so far.
  std::vector<int32_t> encode_parallel(std::string_view text, int threads,
                                       const std::function<void(size_t)>& progress = {}) const;
  // The bytes of the tokens, concatenated. Throws std::out_of_range for an id outside the
  // vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& token_bytes(int32_t id) const { return token_bytes_.at(size_t(id)); }

  // For the merge table (gpt2_tokenizer.cpp).
  struct Merge {
    uint64_t pair = ~uint64_t(0);  // left id << 32 | right id; ~0 = empty slot
    int32_t rank = 0, merged = 0;
  };

 private:
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  // Appends the ids of text; `cache` keeps views into text, which must outlive it.
  void encode_into(std::string_view text, WordCache& cache, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> token_bytes_;  // by id
  int32_t byte_token_[256] = {};          // the id of each single byte
  std::vector<Merge> merges_;             // open addressing, a power of two in size
  bool ranks_ordered_ = true;  // every merge's parts exist before its rank (see bpe)
  std::vector<std::string> files_;
  friend struct Gpt2VocabReader;
};

}  // namespace strata
