// GPT-2's token table, read by two layers: the embedding (the model's first) and the LM head
// (its last, logits = x @ table^T). This object is the one place that decides how a stage
// holds it and shares it; the layers only read what it ties them to (layers_gpt.cpp).
//   - A stage with both layers: the head reads the embedding's table. Nothing is shared.
//   - A pipeline's first stage (the embedding) when the head is on another stage: the table
//     is shared: its gradient is summed with the head stage's copy before each update.
//   - The head's stage without the embedding: a copy of the table, named as the table (so
//     init gives it the same values), laid out after the stage's block in the flat buffers
//     and left out of checkpoints' blocks and of the gradient norm; shared as above.
// Summed gradients take the same update on both stages, so the two tables stay equal.
#pragma once
#include <memory>
#include <vector>

#include "model/layers.h"
#include "model/partition.h"

namespace strata {

class Comm;

class TiedTable {
 public:
  TiedTable() = default;
  // stack: the whole model's built layers (names not yet bound); `stage`: which of them this
  // stage holds. Throws UserError if the stage holds an LM head but the stack no embedding.
  TiedTable(const std::vector<std::unique_ptr<Layer>>& stack, const Partition& stage);
  // The copy this stage lays out after its block (the head's stage), else null.
  Param* copy() const { return copy_.get(); }
  bool is_copy(const Param* p) const { return p && p == copy_.get(); }
  // Ties each LM head among this stage's (bound) layers to the table or the copy, and finds
  // the table the stage shares.
  void tie(std::vector<std::unique_ptr<Layer>>& layers);
  // The tensor whose gradient this stage sums with the other end's: the copy, or the table on
  // the embedding's stage when the head is elsewhere; null when nothing is shared.
  Param* shared() const { return copy_ ? copy_.get() : shared_; }
  // The gradient sum over `ends` (the first and the last stage of one pipeline).
  void share_gradient(Comm& ends) const;
  // In a whole model's parameters (one stage holding every layer), the table this stage's
  // copy stands for; null without a copy.
  const Param* source_in(const std::vector<Param*>& whole_params) const;

 private:
  std::unique_ptr<Param> copy_;
  Param* shared_ = nullptr;
  bool embedding_here_ = false, head_elsewhere_ = false;
};

}  // namespace strata
