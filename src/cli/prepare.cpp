// `strata prepare fashion-mnist` and `strata prepare text`: rank 0 writes the file.
#include "cli/commands.h"

#include <memory>
#include <string>
#include <vector>

#include "base/files.h"
#include "data/prepare.h"
#include "strata/error.h"

namespace strata::cli {

std::vector<Subcommand> add_prepare(CLI::App& app) {
  auto* prepare = app.add_subcommand("prepare", "convert a dataset to strata's HDF5 layout");
  prepare->require_subcommand(1);
  struct Opts {
    std::string out_path, source_dir = "/usr/share/datasets/fashion-mnist";
    std::vector<std::string> text_inputs;
    std::string text_out;
    double val_fraction = 0.1;
    TextTokenizer tokenizer;
  };
  auto o = std::make_shared<Opts>();
  auto* fmnist = prepare->add_subcommand("fashion-mnist", "the IDX files of Debian's dataset-fashion-mnist");
  fmnist->add_option("--out", o->out_path, "output HDF5 file")->required();
  fmnist->add_option("--source", o->source_dir, "directory with the four IDX .gz files")->capture_default_str();
  auto* text = prepare->add_subcommand(
      "text", "text files as tokens for language models: bytes (token = byte, vocab 256) or "
              "GPT-2's BPE (vocab 50257), e.g. Debian's fortunes: /usr/share/games/fortunes/* "
              "without the .dat and .u8 files");
  text->add_option("--input", o->text_inputs, "text files, used in this order")->required();
  text->add_option("--out", o->text_out, "output HDF5 file")->required();
  text->add_option("--val_fraction", o->val_fraction,
                   "the last fraction of each input's bytes that is the validation split")
      ->capture_default_str();
  text->add_option("--tokenizer", o->tokenizer.name,
                   "bytes | gpt2 (GPT-2's byte-level BPE; needs --vocab)")->capture_default_str();
  text->add_option("--vocab", o->tokenizer.vocab_dir,
                   "gpt2: the directory of encoder.json + vocab.bpe (or vocab.json + merges.txt)");
  text->add_option("--threads", o->tokenizer.threads,
                   "gpt2: encoding threads (default: every core this process may use)")
      ->check(int_in(1, kMaxThreads));
  auto prepare_fmnist = [o](Comm& comm) {
    if (comm.rank() == 0) {
      prepare_fashion_mnist(o->source_dir, o->out_path);
      fmt::print("wrote {}\n", o->out_path);
    }
    comm.barrier();
    return int(kExitOk);
  };
  auto prepare_txt = [o](Comm& comm) {
    if (comm.rank() == 0) {
      std::vector<NamedPath> inputs;
      for (const std::string& in : o->text_inputs) inputs.push_back({"--input", in});
      refuse_writing_over({"--out", o->text_out}, inputs);
      const PreparedText t =
          prepare_text(o->text_inputs, o->text_out, o->val_fraction, o->tokenizer);
      fmt::print("wrote {}: {} train tokens, {} val tokens, vocab {} ({}); unigram entropy "
                 "{:.4f} nats/token ({:.4f} bits)\n",
                 o->text_out, t.train_tokens, t.val_tokens, t.vocab,
                 o->tokenizer.name == "gpt2" ? fmt::format("gpt2, {} thread{}", t.threads, t.threads == 1 ? "" : "s") : "bytes",
                 t.unigram_entropy_nats, t.unigram_entropy_nats / std::log(2.0));
    }
    comm.barrier();
    return int(kExitOk);
  };
  return {{fmnist, prepare_fmnist}, {text, prepare_txt}};
}

}  // namespace strata::cli
