// RunConfig: everything a run needs, read from a TOML file (toml++) and `--section.key` flags
// (CLI11).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/parse.h"
#include "config/model_spec.h"

namespace strata {

struct RunConfig {
  std::string config_path;  // the TOML file given with --config ("" if none)
  // Keys the file or the flags set, each with where ("config f.toml:3:1", "flag --model.dim"):
  // a preset fills only the others, and names these when they disagree with it.
  std::map<std::string, std::string> given;

  struct Data {
    // One file, a TOML list of files (kept as its TOML text, "[...]") or a glob.
    std::string path = "data/fashion-mnist.h5";
    std::string format = "auto";  // auto | hdf5 | llmc | nanogpt (data/token_shards.h)
    std::string val_path;         // token shards' validation split ("" = beside data.path)
  } data;
  struct ModelCfg {
    std::string type = "mlp";  // mlp | cnn | custom | gpt
    std::vector<int> hidden = {256, 128};
    std::string activation = "relu";  // relu | gelu
    std::vector<int> channels = {32, 64};  // cnn: one conv(k, pad k/2)+act+maxpool2 each
    int kernel = 3;
    float dropout = 0.0f;  // after each hidden linear activation
    std::vector<std::string> layers;  // custom: the layer spec (see model.h); gpt: ["N"] blocks
    // gpt: GPT-2's shape. vocab 0 = the data's; dropout applies to the embeddings and both
    // residual branches of every block.
    int heads = 4, dim = 128, context = 64, vocab = 0;
    // gpt: a published shape (presets.cpp: gpt2, gpt2-medium, gpt2-large, gpt2-xl) that sets
    // type, layers, heads, dim, context and vocab; "none" = the keys as given.
    std::string preset = "none";
    // gpt: the token table's rows rounded up to a multiple of 128 (llm.c's padding; the padded
    // rows are never used). Default off; a preset turns it on unless the config sets it.
    bool pad_vocab = false;
    // gpt: the blocks' GELU, "erf" (exact) | "tanh" (GPT-2's, Hugging Face's gelu_new, llm.c's).
    // Default erf; a preset sets tanh unless the config sets it.
    std::string gelu = "erf";
    int gpt_blocks() const;  // model.layers as a count for gpt (default 4)
    int vocab_row_multiple() const { return pad_vocab ? 128 : 0; }
  } model;
  struct Train {
    int64_t epochs = 1;
    int64_t batch_size = 64;  // GLOBAL batch, split over data-parallel ranks
    std::string optimizer = "sgd";  // sgd | adamw
    double lr = 0.05;
    double momentum = 0.9;
    bool nesterov = false;
    double weight_decay = 0.0;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    std::string lr_schedule = "constant";  // constant | cosine
    int64_t warmup_steps = 0;
    double min_lr = 0.0;
    double grad_clip = 0.0;  // max global gradient norm; 0 = off
    uint64_t seed = 0;
    int64_t log_every = 50;
    int64_t max_steps = 0;  // stop after this many steps (0 = run all epochs)
    // fp32 | bf16: bf16 inputs to the GEMMs of linear layers and convolutions (and, on a GPU,
    // attention's), fp32 accumulation, master weights, optimizer state and reductions.
    std::string precision = "fp32";
    // none | block: keep only each transformer block's input from forward and recompute the
    // rest in backward (less activation memory for about one more forward).
    std::string recompute = "none";
    // gpt: the initial parameters from a Hugging Face GPT-2 safetensors directory or an llm.c
    // model file ("" = train.seed's initialisation); a resumed checkpoint takes precedence.
    std::string init_from = "";
  } train;
  struct DataParallel {
    double bucket_mb = 1.0;  // gradient allreduce bucket size (the first is 1/8 of it)
    bool overlap = true;     // start bucket allreduces during backward
  } dp;
  struct Parallel {
    int pipeline_stages = 1;    // P; data-parallel width D = ranks / (P T)
    int tensor = 1;             // T: ranks splitting each transformer block (Megatron-style)
    int microbatches = 0;       // M per step; 0 = the largest divisor of the per-replica
                                // batch up to 4 P (1 without a pipeline)
    std::string schedule = "1f1b";  // 1f1b | gpipe | zb-h1 | zb-h2 | interleaved (pipeline_schedule.h)
    int virtual_stages = 1;         // v: model chunks per stage (interleaved: 2 or more)
    std::vector<int> stage_layers;  // layers per stage (per chunk, P v of them, in layer order
                                    // when interleaved); empty = balanced by `balance` cost
    std::string balance = "estimated";  // estimated (FLOPs) | measured (timed on rank 0)
    std::string placement = "replicas_in_node";  // | pipeline_in_node (see grid.h)
    int zero = 0;  // optimizer state (1) and gradient sums (2) sharded over replicas (zero.h)
    // parallel.auto: the grid keys above chosen by the planner (plan/auto_grid.h) for the
    // ranks the run was launched on: the best grid that fits memory_per_rank (0 = the node's
    // memory over its ranks), timed from a machine profile and comm model when given.
    bool auto_plan = false;
    double memory_per_rank = 0;
    std::string profile = "", comm = "";
  } parallel;
  struct Checkpoint {
    std::string dir = "";       // default <output.dir>/checkpoints
    int64_t every_steps = 0;    // 0 = off
    double every_seconds = 0;   // 0 = off
    int64_t keep_last = 3;      // newest K kept; older ones deleted (unless kept by keep_every)
    int64_t keep_every = 0;     // every M-th checkpoint (by sequence number) is never deleted
    bool final = true;          // write one when training finishes
    std::string writer = "auto";  // auto | rank0 | parallel (ZeRO shards: checkpointer.h)
    bool async = true;          // periodic ones: snapshot, then write on a background thread
    // A node-local directory ("" = off; "%n" = the Slurm node's name) that receives each
    // checkpoint first; a background thread copies it to `dir` (checkpoint_cache.h).
    std::string local_dir = "";
    // Every K steps each rank's part into node memory and a partner node's (0 = off;
    // memory_checkpoints.h); memory_dir "" = /dev/shm/strata-<job>, "%n" = the node's name.
    int64_t memory_every = 0;
    std::string memory_dir = "";
    // With memory_every: the largest share of the step time the saves may take; after the
    // first saves the interval grows from memory_every until it fits (0 = a fixed interval).
    double memory_budget = 0;
  } checkpoint;
  struct Watchdog {
    double timeout_s = 300;     // a rank without progress this long is named and the job
                                // aborted; 0 = off
    // A process whose heartbeats stop this long (stopped, killed, its node frozen) is named:
    // silence is unambiguous where a slow step is not, so it is judged sooner. At most
    // timeout_s; 0 = timeout_s.
    double heartbeat_timeout_s = 30;
  } watchdog;
  struct Output {
    std::string dir = "runs/default";
    std::string params = "";   // final parameters file; default <dir>/model.h5
    std::string metrics = "";  // JSON lines; default <dir>/metrics.jsonl (--metrics overrides)
    // Prometheus text file for node_exporter's textfile collector, rewritten by rank 0 after
    // every log interval ("" = none; --prometheus overrides).
    std::string prometheus = "";
  } output;

  // Run-level flags (not in the file).
  int threads = 1;             // --threads; default SLURM_CPUS_PER_TASK, else 1
  std::string device = "auto";
  std::string progress = "auto";  // auto | inplace | lines | off
  std::string resume = "never";   // never | auto | PATH.h5 (--resume)
  std::string trace = "";         // Chrome trace JSON of a few steps, merged over ranks (--trace)
  int64_t trace_steps = 5;        // steps traced, from the second step run (--trace_steps)

  std::string checkpoint_dir() const;

  std::string params_path() const;
  std::string metrics_path() const;
  ModelSpec model_spec(int classes) const;  // expands mlp/cnn into layer specs
  // The effective config, for provenance: every key, as a TOML file `strata train --config`
  // reads back to the same RunConfig.
  std::string to_toml() const;
};

// One config key: `[section] key = value` in a TOML file and `--section.key VALUE` on the
// command line, bound to its field of a RunConfig. config_keys() is the one list of keys: the
// flags, the file reader, the effective config written into checkpoints and docs/configuration.md's
// table all come from it.
struct ConfigKey {
  using Field = std::variant<int*, int64_t*, uint64_t*, double*, float*, bool*, std::string*,
                             std::vector<int>*, std::vector<std::string>*>;
  std::string name;  // "train.lr"
  Field field;
  Range range;                       // numbers, and each element of a list of integers
  std::vector<std::string> choices;  // strings: the allowed values (empty = any text)
  std::string help;
  bool count_or_list = false;        // model.layers: a list of strings, or one integer (gpt)
  bool list_as_text = false;         // data.path: a string, or a list of strings kept as its
                                     // TOML text ("[\"a.bin\", \"b.bin\"]")

  std::string section() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
  // "an integer", "a number", "true or false", "a string", "a list of integers", ...
  std::string expects() const;
  // The current value as TOML ("0.05", "\"sgd\"", "[256, 128]").
  std::string to_toml() const;

  // Checked stores: `where` names the source for the error ("flag --train.lr",
  // "config f.toml:3:1: key train.lr"); a bad value throws UserError(kExitBadInput).
  void set_int(int64_t v, const std::string& where) const;
  void set_real(double v, std::string_view written, const std::string& where) const;
  void set_bool(bool v, const std::string& where) const;
  void set_text(const std::string& v, const std::string& where) const;
  void set_int_list(const std::vector<int64_t>& v, const std::string& where) const;
  void set_text_list(const std::vector<std::string>& v, const std::string& where) const;
  // From the text of a flag's values, parsed strictly (parse.h).
  void set_from_flag(const std::vector<std::string>& texts) const;
};
std::vector<ConfigKey> config_keys(RunConfig& cfg);
// The pipeline schedules parallel.schedule accepts (parallel/pipeline_schedule.h runs them).
const std::vector<std::string>& pipeline_schedules();
// The key named `name` in `keys`, or null; `suggestion` gets the closest name when there is one.
const ConfigKey* find_config_key(const std::vector<ConfigKey>& keys, std::string_view name,
                                 std::string* suggestion = nullptr);

// The elements of a TOML array written as a flag's value ("[2048, 2048]", "[ 16 ,8 , ]", several
// lines, "[\"linear 64\", \"relu\"]"), as text: integers in decimal, strings as they are. Throws
// UserError naming `where` for text that is not a TOML array, or an element of another type.
std::vector<std::string> toml_array_values(const std::string& text, const std::string& where);

// Reads a TOML config file into `cfg`: every key must be known and of its type and range; a
// duplicate key or a TOML syntax error is an error naming FILE:LINE:COL. Throws UserError.
void read_config_file(const std::string& path, RunConfig& cfg);
// The same from text (`source` names it in errors): what read_config_file and the fuzzer use.
void read_config_text(std::string_view text, const std::string& source, RunConfig& cfg);

// The `--section.key` flags of every config key on `sub`, and `--config FILE`. Values are kept
// as text until apply_config_flags() parses them strictly over what the file set.
struct ConfigFlags {
  std::string config_path;
  std::map<std::string, std::vector<std::string>> given;  // by key name
};
void add_config_flags(CLI::App& sub, ConfigFlags& flags);
// Builds the run's config: defaults, then the file (if any), then the flags given.
void apply_config(const ConfigFlags& flags, RunConfig& cfg);
// model.preset's keys (presets.cpp): set where the config left them, checked where it set
// them (a different value is a UserError naming both keys). read_config_text and
// apply_config run it; running it again changes nothing.
void apply_model_preset(RunConfig& cfg);
// The preset names model.preset takes, "none" first.
const std::vector<std::string>& model_presets();

// Cross-key checks a single key's range cannot express; throws UserError naming the key.
void validate(const RunConfig& cfg);

}  // namespace strata
