// ShardPlan on its own (runtime/fsdp/shard_plan.h): pure arithmetic, checked against an
// independent per-element reference -- every flat element is assigned to a rank by division and
// to a parameter by a linear search -- for uneven sizes, alignments and group sizes.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/registry.h"
#include "runtime/fsdp/shard_plan.h"
#include "util/error.h"

namespace test_shard_plan {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace {

using tessera::fsdp::ShardPlan;
using Params = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// (param index, element of the param) of flat element i, or (-1, -1) for a gap or the end padding.
std::pair<int, int64_t> owner(const Params& params, int64_t align, int64_t i) {
  int64_t cursor = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    int64_t n = 1;
    for (int64_t d : params[p].second) n *= d;
    const int64_t start = (cursor + align - 1) / align * align;  // each parameter starts aligned
    if (i >= start && i < start + n) return {static_cast<int>(p), i - start};
    cursor = start + n;
  }
  return {-1, -1};
}

void expect_matches_reference(const Params& params, int world, int64_t align) {
  const ShardPlan plan = ShardPlan::make(params, world, align);
  SCOPED_TRACE("world " + std::to_string(world) + " align " + std::to_string(align));
  EXPECT_EQ(plan.padded_total % (world * align), 0);
  EXPECT_GE(plan.padded_total, plan.total);
  if (plan.total > 0) EXPECT_LT(plan.padded_total - plan.total, world * align);  // less than one quantum
  EXPECT_EQ(plan.chunk * world, plan.padded_total);
  for (int r = 0; r < world; ++r) {
    // The plan's view of rank r's shard, element by element.
    std::vector<std::pair<int, int64_t>> got(plan.chunk, {-1, -1});
    int64_t covered = 0;
    for (const auto& s : plan.slices(r)) {
      ASSERT_GE(s.shard_offset, 0);
      ASSERT_LE(s.shard_offset + s.length, plan.chunk);
      for (int64_t k = 0; k < s.length; ++k) {
        EXPECT_EQ(got[s.shard_offset + k].first, -1) << "two slices overlap in rank " << r;
        got[s.shard_offset + k] = {s.param, s.param_offset + k};
      }
      covered += s.length;
    }
    for (int64_t k = 0; k < plan.chunk; ++k)
      ASSERT_EQ(got[k], owner(params, align, r * plan.chunk + k)) << "rank " << r << " element " << k;
    EXPECT_EQ(plan.padding(r), plan.chunk - covered);
  }
}

TEST(ShardPlan, MatchesAPerElementReference) {
  const Params params = {{"a", {3, 5}}, {"b", {7}}, {"c", {1}}, {"d", {2, 2, 3}}, {"e", {0}}, {"f", {13}}};
  for (int world : {1, 2, 3, 4, 7, 64})
    for (int64_t align : {1, 4, 16}) expect_matches_reference(params, world, align);
}

TEST(ShardPlan, OffsetsDoNotDependOnTheGroupSize) {
  const Params params = {{"w", {10, 3}}, {"b", {3}}, {"n", {5}}};
  const ShardPlan a = ShardPlan::make(params, 2, 8), b = ShardPlan::make(params, 5, 8), c = a.with_world(5);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].offset, b.params[i].offset);
    EXPECT_EQ(a.params[i].offset % 8, 0);
  }
  EXPECT_EQ(a.total, b.total);
  EXPECT_EQ(c.padded_total, b.padded_total);
  EXPECT_EQ(c.chunk, b.chunk);
  EXPECT_EQ(c.world, 5);
  // 30 + pad to 32, 3 + pad to 40, 5 -> total 45; W=2, A=8: quantum 16 -> 48; W=5: quantum 40 -> 80.
  EXPECT_EQ(a.total, 45);
  EXPECT_EQ(a.padded_total, 48);
  EXPECT_EQ(b.padded_total, 80);
  EXPECT_EQ(b.chunk, 16);
}

TEST(ShardPlan, MoreRanksThanElementsArePaddedNotRefused) {
  const ShardPlan p = ShardPlan::make({{"x", {3}}}, 8);
  EXPECT_EQ(p.chunk, 1);
  EXPECT_EQ(p.padding(0), 0);
  EXPECT_EQ(p.padding(3), 1);
  EXPECT_TRUE(p.slices(7).empty());
  const ShardPlan empty = ShardPlan::make({}, 4, 2);
  EXPECT_EQ(empty.total, 0);
  EXPECT_EQ(empty.padded_total, 8);  // one quantum at least
}

TEST(ShardPlan, SlicesInAnArbitraryRange) {
  const ShardPlan p = ShardPlan::make({{"a", {4}}, {"b", {4}}}, 1);
  const auto s = p.slices_in(2, 6);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].param, 0);
  EXPECT_EQ(s[0].param_offset, 2);
  EXPECT_EQ(s[0].shard_offset, 0);
  EXPECT_EQ(s[0].length, 2);
  EXPECT_EQ(s[1].param, 1);
  EXPECT_EQ(s[1].param_offset, 0);
  EXPECT_EQ(s[1].shard_offset, 2);
  EXPECT_EQ(s[1].length, 2);
}

TEST(ShardPlan, EveryPresetLaysQkvAndGateUpOutOneAfterAnother) {
  // The model's q/k/v and gate/up products are one GEMM each where the weights are adjacent in the
  // gathered buffer (model/stacked_linear.h): the FSDP alignment (16 elements) must fall between
  // them for every preset without biases (Qwen2's q/k/v biases sit between its weights).
  for (const std::string& name : tessera::model::ModelConfig::preset_names()) {
    const tessera::model::ModelConfig c = tessera::model::ModelConfig::preset(name);
    const auto units = c.spec().unit_specs(c);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& t : units.at(1).tensors) shapes.emplace_back(t.name, t.shape);
    const ShardPlan plan = ShardPlan::make(shapes, 8, 16);
    auto offset_of = [&](const std::string& suffix) -> const tessera::fsdp::ParamSlot& {
      for (const tessera::fsdp::ParamSlot& s : plan.params)
        if (s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0) return s;
      throw std::runtime_error("no " + suffix);
    };
    auto adjacent = [&](const char* a, const char* b) {
      const auto &x = offset_of(a), &y = offset_of(b);
      return x.offset + x.numel == y.offset;
    };
    EXPECT_TRUE(adjacent("mlp.gate_proj.weight", "mlp.up_proj.weight")) << name;
    if (c.qkv_bias) continue;
    EXPECT_TRUE(adjacent("q_proj.weight", "k_proj.weight")) << name;
    EXPECT_TRUE(adjacent("k_proj.weight", "v_proj.weight")) << name;
  }
}

TEST(ShardPlan, BadArgumentsAreInternalErrors) {
  EXPECT_THROW(ShardPlan::make({{"x", {3}}}, 0), tessera::Error);
  EXPECT_THROW(ShardPlan::make({{"x", {3}}}, 2, 0), tessera::Error);
  EXPECT_THROW(ShardPlan::make({{"x", {-1}}}, 2), tessera::Error);
  EXPECT_THROW(ShardPlan::make({{"x", {3}}}, 2).slices(2), tessera::Error);
}

}  // namespace

}  // namespace test_shard_plan
