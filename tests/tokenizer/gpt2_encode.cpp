// Test tool: strata's GPT-2 tokenizer on files, for gpt2_vs_reference.py.
//   gpt2_encode VOCAB_DIR THREADS OUT FILE...
// Encodes each FILE on one thread and on THREADS threads (encode_parallel, pieces of at least
// 64 KiB), and checks that both give the same ids and that decoding them gives the file's
// bytes back. Writes OUT: per file, one line of its ids (space-separated). Prints the one-thread
// and THREADS-thread throughput in MB/s. Exit 1 on the first mismatch, naming the file.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: gpt2_encode VOCAB_DIR THREADS OUT FILE...\n");
    return 2;
  }
  const strata::Gpt2Tokenizer tok = strata::Gpt2Tokenizer::load(argv[1]);
  const int threads = std::stoi(argv[2]);
  std::ofstream out(argv[3], std::ios::binary);
  double one_s = 0, many_s = 0, bytes = 0;
  using clock = std::chrono::steady_clock;
  for (int i = 4; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto t0 = clock::now();
    const std::vector<int32_t> ids = tok.encode(text);
    auto t1 = clock::now();
    const std::vector<int32_t> par = tok.encode_parallel(text, threads);
    auto t2 = clock::now();
    one_s += std::chrono::duration<double>(t1 - t0).count();
    many_s += std::chrono::duration<double>(t2 - t1).count();
    bytes += double(text.size());
    if (par != ids) {
      std::fprintf(stderr, "%s: %d threads give other ids than one thread\n", argv[i], threads);
      return 1;
    }
    if (tok.decode(ids) != text) {
      std::fprintf(stderr, "%s: decode(encode(text)) is not the text\n", argv[i]);
      return 1;
    }
    for (size_t k = 0; k < ids.size(); ++k) out << (k ? " " : "") << ids[k];
    out << "\n";
  }
  std::printf("strata: %.1f MB, 1 thread %.2f MB/s, %d threads %.2f MB/s\n", bytes / 1e6,
              bytes / 1e6 / one_s, threads, bytes / 1e6 / many_s);
  return out.good() ? 0 : 1;
}
