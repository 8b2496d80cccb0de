#include "model/tied_table.h"

#include "strata/comm.h"
#include "strata/error.h"

namespace strata {

TiedTable::TiedTable(const std::vector<std::unique_ptr<Layer>>& stack, const Partition& stage) {
  bool head_here = false, head_anywhere = false;
  Param* whole_table = nullptr;
  std::string table_name;
  for (int i = 0; i < int(stack.size()); ++i) {
    Layer& l = *stack[size_t(i)];
    head_anywhere = head_anywhere || is_lm_head(l);
    if (Param* t = token_table(l)) {
      whole_table = t;
      table_name = l.name + "." + t->name;
      embedding_here_ = embedding_here_ || stage.holds(i);
    }
    head_here = head_here || (stage.holds(i) && is_lm_head(l));
  }
  head_elsewhere_ = head_anywhere && !head_here;
  if (head_here && !embedding_here_) {
    if (!whole_table) fail_input("model: the LM head needs an embedding layer before it");
    copy_ = std::make_unique<Param>(*whole_table);
    copy_->name = table_name;
  }
}

void TiedTable::tie(std::vector<std::unique_ptr<Layer>>& layers) {
  for (auto& h : layers) {
    if (!is_lm_head(*h)) continue;
    bool tied = copy_ && tie_lm_head(*h, *copy_);
    for (auto& e : layers) tied = tied || tie_lm_head(*h, *e);
    STRATA_CHECK(tied, "LM head {} not tied", h->name);
  }
  if (embedding_here_ && head_elsewhere_)
    for (auto& e : layers)
      if (Param* t = token_table(*e)) shared_ = t;
}

void TiedTable::share_gradient(Comm& ends) const {
  if (const Param* t = shared()) ends.allreduce_sum(t->grad, numel(t->shape));
}

const Param* TiedTable::source_in(const std::vector<Param*>& whole_params) const {
  if (!copy_) return nullptr;
  for (const Param* p : whole_params)
    if (p->name == copy_->name) return p;
  return nullptr;
}

}  // namespace strata
