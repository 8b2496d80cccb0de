#include "checkpoint/hf_gpt2.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "base/files.h"
#include "base/json.h"
#include "base/metrics.h"
#include "checkpoint/safetensors.h"
#include "strata/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad(const std::string& msg) { throw UserError(kExitBadCheckpoint, msg); }

// transformers' GPT2Config for the model: its GELU ("gelu_new", GPT-2's tanh form, for
// model.gelu = "tanh"; "gelu", the exact erf form, otherwise), LayerNorm's eps 1e-5, attention scaled by 1/sqrt(head size), no
// attention dropout; the LM head tied to wte.
std::string config_json(const GptDims& d, const std::string& dtype, bool gpt2_tokenizer) {
  const std::string eot = gpt2_tokenizer ? "50256" : "null";
  return fmt::format(
      "{{\n"
      "  \"activation_function\": \"{8}\",\n"
      "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
      "  \"attn_pdrop\": 0.0,\n"
      "  \"bos_token_id\": {0},\n"
      "  \"embd_pdrop\": {1},\n"
      "  \"eos_token_id\": {0},\n"
      "  \"initializer_range\": 0.02,\n"
      "  \"layer_norm_epsilon\": 1e-05,\n"
      "  \"model_type\": \"gpt2\",\n"
      "  \"n_ctx\": {2},\n"
      "  \"n_embd\": {3},\n"
      "  \"n_head\": {4},\n"
      "  \"n_inner\": null,\n"
      "  \"n_layer\": {5},\n"
      "  \"n_positions\": {2},\n"
      "  \"reorder_and_upcast_attn\": false,\n"
      "  \"resid_pdrop\": {1},\n"
      "  \"scale_attn_by_inverse_layer_idx\": false,\n"
      "  \"scale_attn_weights\": true,\n"
      "  \"tie_word_embeddings\": true,\n"
      "  \"torch_dtype\": \"{6}\",\n"
      "  \"use_cache\": true,\n"
      "  \"vocab_size\": {7}\n"
      "}}\n",
      eot, d.dropout > 0 ? fmt::format("{}", d.dropout) : "0.0", d.T, d.C, d.NH, d.L,
      dtype == "BF16" ? "bfloat16" : "float32", d.V, d.gelu_tanh ? "gelu_new" : "gelu");
}

// The file of shard k of n (1-based), as transformers names them.
std::string shard_name(size_t k, size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n);
}

void remove_if_there(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

}  // namespace

void export_hf(const GptDims& d, const GptWeights& w, const GptFileAttrs& attrs,
               const std::string& dir, const HfExport& opt, const std::string& source) {
  const bool gpt2_tok = tokenizer_name(attrs.tokenizer) == "gpt2";
  if (gpt2_tok) check_tokenizer_files(attrs, source);  // before anything is written
  if (const std::string why = make_directories(dir); !why.empty())
    fail_input("--out {}: cannot create the directory ({})", dir, why);
  // The tensors, in Hugging Face's layout, grouped into shards of at most max_shard_bytes.
  std::vector<std::vector<SafeTensor>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const GptTensor& t : gpt_tensors(d)) {
    const std::vector<float>& v = w.at(t.strata);
    const int64_t n = numel(t.shape);  // the token table: its first V rows
    const std::vector<float> tr = t.conv1d ? transposed(v.data(), t.shape[0], t.shape[1]) : std::vector<float>();
    SafeTensor st{.name = t.hf, .dtype = opt.dtype, .shape = hf_shape(t),
                  .bytes = encode_floats(t.conv1d ? tr.data() : v.data(), n, opt.dtype)};
    const int64_t bytes = int64_t(st.bytes.size());
    if (in_shard > 0 && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
    shards.back().push_back(std::move(st));
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const fs::path out(dir);
  // A previous export's shards that this one does not overwrite.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("model-") && n.find("-of-") != std::string::npos && n.ends_with(".safetensors"))
      remove_if_there(e.path());
  }
  if (shards.size() == 1) {
    remove_if_there(out / "model.safetensors.index.json");
    write_safetensors((out / "model.safetensors").string(), shards[0], meta);
  } else {
    remove_if_there(out / "model.safetensors");
    std::string map;
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shard_name(k + 1, shards.size());
      for (const SafeTensor& t : shards[k])
        map += fmt::format("{}    {}: {}", map.empty() ? "" : ",\n", json_string(t.name), json_string(name));
      write_safetensors((out / name).string(), shards[k], meta);
    }
    publish_text_file((out / "model.safetensors.index.json").string(),
                      fmt::format("{{\n  \"metadata\": {{\"total_size\": {}}},\n  \"weight_map\": "
                                  "{{\n{}\n  }}\n}}\n", total, map));
  }
  publish_text_file((out / "config.json").string(), config_json(d, opt.dtype, gpt2_tok));
  if (gpt2_tok) write_tokenizer_files(attrs, dir, d.T);
}

namespace {

// The tensors of a directory's index and shards (or one file), by name, each with its file.
struct Found {
  SafeTensor t;
  std::string file;
};
void collect(const std::string& file, std::map<std::string, Found>& by_name,
             const std::map<std::string, std::string>* weight_map) {
  SafeTensorsFile f = read_safetensors(file);
  for (SafeTensor& t : f.tensors) {
    std::string name = t.name;
    if (weight_map) {
      auto it = weight_map->find(name);
      if (it == weight_map->end() || fs::path(file).filename() != it->second)
        bad(fmt::format("{}: holds {}, which model.safetensors.index.json's weight_map {}", file,
                        name, it == weight_map->end() ? "does not list" : "places in " + it->second));
    }
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);  // save_pretrained's prefix
    if (by_name.count(name)) bad(fmt::format("{}: tensor {} appears twice", file, name));
    by_name[name] = {std::move(t), file};
  }
}

// config.json's activation_function against the model's GELU. transformers' GPT2Config
// defaults to "gelu_new" (GPT-2's tanh form; "gelu_pytorch_tanh" is the same function), and
// "gelu" is the exact erf form; a model that runs another GELU than the weights were trained
// with is refused rather than silently changed.
void check_activation(const JsonValue* act, const GptDims& dims, const std::string& where) {
  const std::string name = !act ? "gelu_new" : act->is_string() ? act->text : "(not a string)";
  const bool tanh = name == "gelu_new" || name == "gelu_pytorch_tanh";
  if (!tanh && name != "gelu")
    bad(fmt::format("{}: activation_function = \"{}\" is not a GELU strata runs (gelu_new or "
                    "gelu_pytorch_tanh: tanh; gelu: erf)", where, name));
  if (tanh != dims.gelu_tanh)
    bad(fmt::format("{}: activation_function = \"{}\" is the {} GELU; the model's is {}", where, name,
                    tanh ? "tanh" : "erf", gelu_name(dims.gelu_tanh)));
}

std::map<std::string, Found> read_hf_tensors(const std::string& path, const GptDims& dims) {
  std::map<std::string, Found> by_name;
  struct stat sb{};
  ::stat(path.c_str(), &sb);
  if (!S_ISDIR(sb.st_mode)) {
    collect(path, by_name, nullptr);
    return by_name;
  }
  const fs::path dir(path);
  if (fs::exists(dir / "config.json")) {  // the one size the shapes do not show: heads
    const std::string where = (dir / "config.json").string();
    JsonValue c;
    try {
      c = parse_json(read_whole_file(where), where);
    } catch (const UserError& e) {
      bad(e.what());
    }
    const JsonValue* nh = c.is_object() ? c.find("n_head") : nullptr;
    if (nh && (!nh->is_int() || nh->int_value != dims.NH))
      bad(fmt::format("{}: n_head = {}; the model has {} heads (model.heads)", where,
                      nh->is_int() ? fmt::format("{}", nh->int_value) : "(not an integer)", dims.NH));
    check_activation(c.is_object() ? c.find("activation_function") : nullptr, dims, where);
  }
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    if (!fs::exists(dir / "model.safetensors"))
      fail_input("train.init_from: {}: holds neither model.safetensors nor "
                 "model.safetensors.index.json", path);
    collect((dir / "model.safetensors").string(), by_name, nullptr);
    return by_name;
  }
  JsonValue j;
  try {
    j = parse_json(read_whole_file(index.string()), index.string());
  } catch (const UserError& e) {
    bad(e.what());
  }
  const JsonValue* wm = j.is_object() ? j.find("weight_map") : nullptr;
  if (!wm || !wm->is_object()) bad(fmt::format("{}: no \"weight_map\" object", index.string()));
  std::map<std::string, std::string> weight_map;
  std::set<std::string> files;
  for (const auto& [name, file] : wm->members) {
    if (!file.is_string() || file.text.empty() || file.text.find('/') != std::string::npos)
      bad(fmt::format("{}: weight_map[\"{}\"] is not a file name in the directory", index.string(), name));
    weight_map[name] = file.text;
    files.insert(file.text);
  }
  for (const std::string& f : files) collect((dir / f).string(), by_name, &weight_map);
  for (const auto& [name, file] : weight_map) {
    const std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (!by_name.count(n))
      bad(fmt::format("{}: weight_map places {} in {}, which does not hold it", index.string(), name, file));
  }
  return by_name;
}

// Tensors a GPT-2 file may hold beyond the parameters: the causal-mask buffers of older
// transformers (h.N.attn.bias, h.N.attn.masked_bias) and the tied lm_head.weight.
bool ignorable(const std::string& name) {
  auto ends = [&](const char* s) { return name.size() > strlen(s) && name.ends_with(s); };
  return name == "lm_head.weight" ||
         (name.rfind("h.", 0) == 0 && (ends(".attn.bias") || ends(".attn.masked_bias")));
}

}  // namespace

GptWeights import_hf(const std::string& path, const GptDims& dims) {
  std::map<std::string, Found> found = read_hf_tensors(path, dims);
  // Every name and shape first, in the model's order: the first mismatch is the one named.
  const std::vector<GptTensor> want = gpt_tensors(dims);
  std::vector<const Found*> got;
  for (const GptTensor& t : want) {
    auto it = found.find(t.hf);
    if (it == found.end())
      bad(fmt::format("train.init_from: {}: tensor {} is missing (the model needs shape {})",
                      path, t.hf, shape_str(hf_shape(t))));
    const SafeTensor& s = it->second.t;
    Shape need = hf_shape(t);
    if (t.strata == "embedding1.wte" && s.shape.size() == 2 && s.shape[1] == dims.C) {
      check_vocab(s.shape[0], dims, it->second.file, t.hf);
      need[0] = s.shape[0];
    }
    if (s.shape != need)
      bad(fmt::format("{}: tensor {} has shape {}; the model needs {} (model.* config keys)",
                      it->second.file, t.hf, shape_str(s.shape), shape_str(need)));
    got.push_back(&it->second);
  }
  for (const auto& [name, f] : found) {
    const bool wanted = std::any_of(want.begin(), want.end(), [&](const GptTensor& t) { return t.hf == name; });
    if (!wanted && !ignorable(name))
      bad(fmt::format("{}: holds tensor {}, which is not one of the model's ({} blocks)", f.file,
                      name, dims.L));
  }
  GptWeights w;
  for (size_t i = 0; i < want.size(); ++i) {
    const GptTensor& t = want[i];
    std::vector<float> v = decode_floats(got[i]->t.bytes, got[i]->t.dtype,
                                         fmt::format("{}: tensor {}", got[i]->file, t.hf));
    if (t.conv1d) v = transposed(v.data(), t.shape[1], t.shape[0]);
    if (t.strata == "embedding1.wte") v.resize(size_t(dims.Vp * dims.C), 0.f);
    w[t.strata] = std::move(v);
  }
  return w;
}

}  // namespace strata
