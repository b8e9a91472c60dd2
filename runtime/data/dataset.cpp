#include "runtime/data/dataset.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "runtime/data/token_file.h"
#include "util/budgets.h"
#include "util/error.h"
#include "util/parse_named.h"

namespace tessera::data {

namespace {

constexpr int64_t kRowsPerCheckpoint = 64;

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from (store, doc, piece), fixed for all runs.
double split_hash(int64_t store, int64_t doc, int64_t piece) {
  uint64_t h = mix(0x7e55e4a5a1ULL + static_cast<uint64_t>(store));
  h = mix(h ^ static_cast<uint64_t>(doc));
  h = mix(h ^ static_cast<uint64_t>(piece));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace

Truncation parse_truncation(const std::string& s) {
  return util::parse_named<Truncation>(truncation_names(), s, "data.truncation");
}

std::vector<std::shared_ptr<const DocStore>> load_documents(const std::vector<std::string>& paths,
                                                            const text::Tokenizer& tok, const text::ChatTemplate& chat,
                                                            ReadStats& stats, DataFormat format) {
  std::vector<DataListing> listings;
  for (const auto& path : paths) listings.push_back(list_data(path, format));
  return load_documents(listings, tok, chat, stats);
}

std::vector<std::shared_ptr<const DocStore>> load_documents(const std::vector<DataListing>& listings,
                                                            const text::Tokenizer& tok, const text::ChatTemplate& chat,
                                                            ReadStats& stats) {
  std::vector<std::shared_ptr<const DocStore>> stores;
  for (const DataListing& listing : listings) {
    size_t in_memory = 0;  // bytes of this path's in-memory stores: util::budget::kInMemoryDataBytes
    stats.inputs.push_back(listing.path + ": " + listing.summary());
    for (const DataFile& file : listing.files) {
      if (file.format == FileFormat::Tokens) {
        auto store = open_token_file(file.path);
        if (store->vocab() != tok.vocab_size())
          throw TESSERA_INPUT_ERROR("token file " + file.path + " was written with a vocab of " +
                                    std::to_string(store->vocab()) + ", but the tokenizer " + tok.name() +
                                    " has a vocab of " + std::to_string(tok.vocab_size()));
        ++stats.files;
        stats.documents += store->num_documents();
        stats.tokens += store->num_tokens();
        stores.push_back(std::move(store));
        continue;
      }
      MemoryStoreBuilder builder(file.path, tok.vocab_size(), util::budget::kInMemoryDataBytes - in_memory);
      read_file(file, tok, chat, builder, stats);
      in_memory += builder.bytes();
      stores.push_back(builder.finish());
    }
  }
  return stores;
}

std::shared_ptr<TokenDataset> load_dataset(const std::vector<std::string>& paths, const text::Tokenizer& tok,
                                           PackOptions opts) {
  ReadStats stats;
  return std::make_shared<TokenDataset>(load_documents(paths, tok, *text::make_chat_template("llama2"), stats), opts);
}

TokenDataset::TokenDataset(std::vector<std::shared_ptr<const DocStore>> stores, PackOptions opts)
    : stores_(std::move(stores)), opts_(opts) {
  TESSERA_CHECK_INPUT(opts_.seq_len > 0, "seq_len must be positive, got " + std::to_string(opts_.seq_len));
  TESSERA_CHECK_INPUT(opts_.val_fraction >= 0 && opts_.val_fraction < 1,
                      "data.val_fraction must be in [0, 1), got " + std::to_string(opts_.val_fraction));
  int64_t documents = 0, tokens = 0;
  for (const auto& s : stores_) {
    description_ += (description_.empty() ? "" : ",") + s->source();
    documents += s->num_documents();
    tokens += s->num_tokens();
  }
  if (stores_.empty()) throw TESSERA_INPUT_ERROR("no data path given");
  Cursor c;
  std::vector<Unit> units;
  for (;;) {
    if (num_rows_ % kRowsPerCheckpoint == 0) checkpoints_.push_back(c);
    if (!fill_row(c, units, &stats_)) break;
    ++num_rows_;
    num_units_ += static_cast<int64_t>(units.size());
    for (const Unit& u : units) num_tokens_ += u.length;
  }
  stats_.documents = num_units_;
  if (num_rows_ == 0) {
    const std::string split = opts_.val_fraction > 0 ? (opts_.validation ? " in the validation split" : " in the training split") : "";
    std::string why = tokens == 0 ? "0 tokens in " + std::to_string(documents) + " document(s)"
                                  : std::to_string(tokens) + " tokens in " + std::to_string(documents) +
                                        " document(s), no unit with a token to predict";
    if (stats_.dropped) why += "; " + stats_.drop_summary();
    throw TESSERA_INPUT_ERROR("data " + description_ + " holds no trainable sequence of seq_len " +
                              std::to_string(opts_.seq_len) + split + ": " + why);
  }
}

bool TokenDataset::next_unit(Cursor& c, Unit& u, Cursor& at, ReadStats* stats) const {
  const int64_t L = opts_.seq_len;
  while (c.store < static_cast<int64_t>(stores_.size())) {
    const DocStore& s = *stores_[c.store];
    if (c.doc >= s.num_documents()) {
      c = {c.store + 1, 0, 0};
      continue;
    }
    const DocStore::Doc d = s.doc(c.doc);
    const Cursor here = c;
    Unit unit{c.store, d.begin, d.length, c.doc};
    if (d.text) {
      const int64_t offset = c.piece * L;
      if (offset + 1 >= d.length) {
        c = {c.store, c.doc + 1, 0};
        continue;
      }
      unit.begin = d.begin + offset;
      unit.length = std::min(L + 1, d.length - offset);
      ++c.piece;
    } else {
      c = {c.store, c.doc + 1, 0};
    }
    if (opts_.val_fraction > 0 && (split_hash(here.store, here.doc, here.piece) < opts_.val_fraction) != opts_.validation)
      continue;
    if (unit.length < 2) continue;  // nothing to predict
    if (!d.text && unit.length > L + 1) {
      const std::string what = "example of " + std::to_string(unit.length) + " tokens is longer than data.seq_len + 1 = " +
                               std::to_string(L + 1);
      if (opts_.truncation == Truncation::Error)
        throw TESSERA_INPUT_ERROR(s.where(here.doc) + ": " + what + " (data.truncation = error; use drop or left)");
      if (opts_.truncation == Truncation::Drop) {
        if (stats) stats->drop(s.where(here.doc), "too long", what);
        continue;
      }
      unit.begin = d.begin + d.length - (L + 1);  // left: keep the end
      unit.length = L + 1;
      bool any = opts_.train_on_all;
      for (int64_t i = unit.begin + 1; !any && i < unit.begin + unit.length; ++i) any = s.target(i);
      if (!any) {
        if (stats) stats->drop(s.where(here.doc), "no target tokens", "no target tokens left after left truncation: " + what);
        continue;
      }
    }
    u = unit;
    at = here;
    return true;
  }
  return false;
}

bool TokenDataset::fill_row(Cursor& c, std::vector<Unit>& units, ReadStats* stats) const {
  units.clear();
  int64_t fill = 0;
  for (;;) {
    Unit u;
    Cursor at;
    if (!next_unit(c, u, at, stats)) break;
    if (!units.empty() && fill + u.length > opts_.seq_len + 1) {
      c = at;  // starts the next row (the units skipped before it are behind us)
      break;
    }
    units.push_back(u);
    fill += u.length;
    if (!opts_.packing) break;
  }
  return !units.empty();
}

std::vector<TokenDataset::Unit> TokenDataset::row_units(int64_t row) const {
  TESSERA_CHECK(row >= 0 && row < num_rows_, "row " + std::to_string(row) + " of " + std::to_string(num_rows_));
  Cursor c = checkpoints_[row / kRowsPerCheckpoint];
  std::vector<Unit> units;
  for (int64_t r = row - row % kRowsPerCheckpoint; r <= row; ++r) fill_row(c, units, nullptr);
  return units;
}

Batch TokenDataset::batch(const std::vector<int64_t>& rows) const {
  const int64_t B = static_cast<int64_t>(rows.size()), L = opts_.seq_len;
  Batch out;
  out.inputs = at::zeros({B, L}, at::kLong);
  out.labels = at::full({B, L}, Batch::kIgnore, at::kLong);
  out.position_ids = at::zeros({B, L}, at::kLong);
  out.document_ids = at::zeros({B, L}, at::kLong);
  int64_t* inputs = out.inputs.data_ptr<int64_t>();
  int64_t* labels = out.labels.data_ptr<int64_t>();
  int64_t* pos = out.position_ids.data_ptr<int64_t>();
  int64_t* docs = out.document_ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<Unit> units = row_units(rows[b]);
    out.packed |= units.size() > 1;
    int64_t slot = 0, last_pos = -1;
    for (size_t k = 0; k < units.size(); ++k) {
      const Unit& u = units[k];
      const DocStore& s = *stores_[u.store];
      for (int64_t i = 0; i < u.length; ++i, ++slot) {
        const int32_t id = s.id(u.begin + i);
        if (opts_.vocab_limit > 0 && id >= opts_.vocab_limit)
          throw TESSERA_INPUT_ERROR(s.where(u.doc) + ": token id " + std::to_string(id) + " is outside the model's vocab_size " +
                                    std::to_string(opts_.vocab_limit));
        if (slot < L) {
          inputs[b * L + slot] = id;
          pos[b * L + slot] = last_pos = i;
          docs[b * L + slot] = static_cast<int64_t>(k);
        }
        if (i >= 1 && (opts_.train_on_all || s.target(u.begin + i))) {
          labels[b * L + slot - 1] = id;
          ++out.targets;
        }
      }
    }
    for (; slot < L; ++slot) {  // padding continues the last unit
      pos[b * L + slot] = ++last_pos;
      docs[b * L + slot] = static_cast<int64_t>(units.size()) - 1;
    }
  }
  if (out.packed) std::tie(out.cu_seqlens, out.max_seqlen) = document_offsets(out.document_ids);
  return out;
}

std::pair<at::Tensor, int64_t> document_offsets(const at::Tensor& document_ids) {
  TESSERA_CHECK(document_ids.dim() == 2 && document_ids.is_cpu(), "document_offsets: [B, L] ids on the CPU");
  const at::Tensor ids = document_ids.to(at::kLong).contiguous();
  const int64_t B = ids.size(0), L = ids.size(1);
  const int64_t* d = ids.data_ptr<int64_t>();
  TESSERA_CHECK(B * L <= std::numeric_limits<int32_t>::max(), "document_offsets: more tokens than int32 offsets hold");
  std::vector<int32_t> starts;
  int64_t longest = 0;
  for (int64_t i = 0; i < B * L; ++i)
    if (i % L == 0 || d[i] != d[i - 1]) {
      if (!starts.empty()) longest = std::max<int64_t>(longest, i - starts.back());
      starts.push_back(static_cast<int32_t>(i));
    }
  if (!starts.empty()) longest = std::max<int64_t>(longest, B * L - starts.back());
  starts.push_back(static_cast<int32_t>(B * L));
  at::Tensor cu = at::empty({static_cast<int64_t>(starts.size())}, at::kInt);
  std::copy(starts.begin(), starts.end(), cu.data_ptr<int32_t>());
  return {cu, longest};
}

}  // namespace tessera::data
