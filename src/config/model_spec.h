// The model description: one typed LayerSpec per layer, from the config (mlp, cnn and gpt
// build them directly) or parsed from text (model.layers of a custom model, the
// model_layers attribute of a checkpoint or parameter file, which stores each layer's text()).
//
// The text form, one layer per string:
//   linear OUT                      conv OUT_CHANNELS KERNEL [STRIDE [PAD]]
//   maxpool KERNEL [STRIDE]         relu   gelu   silu   flatten   dropout P
//   embedding DIM [ROW_MULTIPLE]    block HEADS [DROPOUT [recompute] [tanh]]   layernorm   lmhead
// (embedding's ROW_MULTIPLE: the token table's rows are the vocabulary rounded up to a multiple
// of it, as llm.c pads GPT-2's 50257 to 50304; the padded rows are never read: layers_gpt.cpp.)
// (block's `tanh`: its MLP uses GPT-2's tanh GELU, model.gelu = "tanh"; without it the exact erf
// GELU, as every file written before the word existed.)
// Input sizes are inferred when the model is built (model.h).
#pragma once
#include <string>
#include <vector>

namespace strata {

struct LayerSpec {
  enum class Kind {
    kLinear, kConv, kMaxPool, kRelu, kGelu, kSilu, kFlatten, kDropout,  // image models
    kEmbedding, kBlock, kLayerNorm, kLmHead,                     // GPT-2
  };
  Kind kind = Kind::kFlatten;
  int size = 0;  // linear: outputs; conv: output channels; embedding: width; block: heads
  int kernel = 0, stride = 1, pad = 0;  // conv, maxpool; embedding: pad = the row multiple (0: none)
  float p = 0;                          // dropout, block: dropout probability
  bool recompute = false;               // block: recompute its activations in backward
  bool gelu_tanh = false;               // block: the tanh GELU (GPT-2's), not the erf one
  std::string source;  // the text it was parsed from, for messages (text() otherwise)

  LayerSpec() = default;
  // Parses `text` (errors name model.layers): for literals in code and tests.
  LayerSpec(const char* text);         // NOLINT(google-explicit-constructor)
  LayerSpec(const std::string& text);  // NOLINT(google-explicit-constructor)

  const char* kind_name() const;  // "linear", "conv", ...: also the prefix of layer names
  std::string text() const;       // the canonical text form, as files store it
  bool operator==(const LayerSpec& o) const;  // the layer, not how it was written
};
using ModelSpec = std::vector<LayerSpec>;

// Throws UserError(kExitBadInput) naming `where` ("model.layers", or "FILE: root attribute
// model_layers") and the text: an unknown layer, a wrong number of arguments, a size that is
// not an integer in [1, 2^24], a probability outside [0, 1).
LayerSpec parse_layer_spec(const std::string& text, const std::string& where);
ModelSpec parse_model_spec(const std::vector<std::string>& texts, const std::string& where);
std::vector<std::string> spec_texts(const ModelSpec& spec);

// The typed layers a config builds.
LayerSpec linear_spec(int out);
LayerSpec conv_spec(int channels, int kernel, int stride, int pad);
LayerSpec maxpool_spec(int kernel);
LayerSpec activation_spec(const std::string& name);  // "relu" | "gelu" | "silu"
LayerSpec flatten_spec();
LayerSpec dropout_spec(float p);
LayerSpec embedding_spec(int dim, int row_multiple = 0);
LayerSpec block_spec(int heads, float dropout, bool recompute, bool gelu_tanh = false);
LayerSpec layernorm_spec();
LayerSpec lmhead_spec();

}  // namespace strata
