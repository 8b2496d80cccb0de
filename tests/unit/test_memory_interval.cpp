// checkpoint.memory_budget's interval (run/memory_state.h memory_interval): a save's time over
// the budget's share of a step, kept between checkpoint.memory_every and the recompute bound.
#include <catch2/catch.hpp>

#include "run/memory_state.h"

using strata::memory_interval;

TEST_CASE("memory checkpoints: the budget's interval", "[memory]") {
  // 0.3 ms per save against 1 ms steps at 3 %: 0.03 ms a step allowed, so every 10 steps.
  auto k = memory_interval(0.3e-3, 1e-3, 0.03, 1, 0.5);
  CHECK(k.every == 10);
  CHECK_FALSE(k.capped);
  // Rounded up: 0.31 ms needs 11 steps to stay within 3 %.
  CHECK(memory_interval(0.31e-3, 1e-3, 0.03, 1, 0.5).every == 11);
  // A save cheaper than the budget keeps checkpoint.memory_every (never below it).
  CHECK(memory_interval(1e-6, 1e-3, 0.03, 1, 0.5).every == 1);
  CHECK(memory_interval(1e-6, 1e-3, 0.03, 4, 0.5).every == 4);
  // A save the budget could only carry over more than 0.5 s of steps: the recompute bound.
  k = memory_interval(0.1, 1e-3, 0.03, 1, 0.5);
  CHECK(k.every == 500);
  CHECK(k.capped);
  // Steps longer than the bound: memory_every still (a fault redoes at most those steps).
  k = memory_interval(0.1, 2.0, 0.01, 3, 0.5);
  CHECK(k.every == 3);
  CHECK(k.capped);
}

TEST_CASE("memory budget: the step after a save against the others of the window", "[memory]") {
  strata::SaveWindow w;
  // A save every 3 steps and at two steps in a row (9 and 10: step 10 follows a save and makes
  // one); the step after each save 0.25 ms slower; the machine slower from step 30 on (both
  // kinds alike), which the difference leaves out (against every step's median it would not).
  for (int64_t done = 1; done <= 40; ++done) {
    const double base = done < 30 ? 1e-3 : 1.5e-3;
    const bool saves = done % 3 == 0 || done == 10;
    const bool after = (done - 1) % 3 == 0 && done > 1 || done == 11;
    if (saves) w.saved(done);  // at the step's end, before its time is noted
    w.step(done, base + (after ? 0.25e-3 : 0.0));
  }
  CHECK(w.steps() == 40);
  CHECK(w.slowdown() == Approx(0.25e-3));
  w.clear();
  // A save after every step: no step without one before it, nothing to compare.
  for (int64_t done = 41; done <= 60; ++done) {
    w.saved(done);
    w.step(done, 1e-3);
  }
  CHECK(w.slowdown() == -1);
  CHECK(w.median_step() == Approx(1e-3));
  w.clear();
  // Saves after steps 61-64 in a row: steps 62-65 each follow one (62-64 make one too).
  for (int64_t done = 61; done <= 70; ++done) {
    if (done <= 64) w.saved(done);
    w.step(done, done >= 62 && done <= 65 ? 2e-3 : 1e-3);
  }
  CHECK(w.slowdown() == Approx(1e-3));
}

TEST_CASE("memory budget: the probe of the update's own writes", "[memory]") {
  strata::UpdateProbe p(true, 4);
  using Phase = strata::UpdateProbe::Phase;
  // Four steps in place: updates of 1 ms in steps of 10 ms; then four writing the generations:
  // updates of 1.5 ms in steps of 12 ms (an exchange beside them, say).
  for (int i = 0; i < 8; ++i) {
    REQUIRE(p.phase() == (i < 4 ? Phase::in_place : Phase::writing));
    p.update_starts();
    p.update_ends();  // (a time near 0, replaced below through cost()'s inputs)
    CHECK(p.step_ends(i < 4 ? 10e-3 : 12e-3) == (i == 7));
  }
  const auto c = p.cost(0.1e-3, /*partner=*/false);
  CHECK(c.step == Approx(10e-3));
  CHECK(c.per_step == Approx(std::max(c.writing - c.in_place, 0.0) + 0.1e-3));
  // With a partner the steps' difference (2 ms) counts, being larger.
  CHECK(p.cost(0.1e-3, /*partner=*/true).per_step == Approx(2e-3));
  p.stop();
  CHECK(p.phase() == Phase::off);
  CHECK(strata::UpdateProbe(false, 4).phase() == Phase::off);
}
