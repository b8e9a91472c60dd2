// Dataset splits of a data directory, found as Hugging Face `datasets` finds them (load_dataset on a
// local folder, push_to_hub's data/ shards), so that a directory holding train and test data trains
// on train alone (launcher/data_setup.cpp chooses the splits: data.split, data.val_split).
//
// RULES (datasets' data_files.py, in its order; the first rule that some data file matches decides;
// paths are relative to the data directory, its data files as list_data (format.h) takes them):
//   1. shards:       data/<split>-NNNNN-of-NNNNN<...>.<ext> (five digits each): the splits are the
//                    names found (a word, or words joined by '.': train, test, or any other);
//   2. folder names: a folder on the file's path whose name holds a split keyword delimited by the
//                    start or end of the name or one of "-", ".", "_", " ", a digit (train/, test/,
//                    my_valid/, train-2024/; a save_to_disk DatasetDict's split folders);
//   3. file names:   a file name holding a keyword delimited as in 2, with a delimiter after it
//                    (train.jsonl, test-00000-of-00001.json, my_valid_file.jsonl).
// Keywords: train: train, training; validation: validation, valid, dev, val; test: test, testing,
// eval, evaluation. A file that two splits' keywords match is in both, as in datasets. When no rule
// matches, the directory (and a single file) has one split, train: all of it.
// Data files that a rule leaves in no split are listed in Splits::outside (datasets ignores them).
//
// A save_to_disk DatasetDict (dataset_dict.json beside split folders of Arrow files) is refused in
// one line saying how to export its splits to JSON Lines: Tessera does not read Arrow.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "runtime/data/format.h"

namespace tessera::data {

struct Splits {
  std::string path;                          // the data path
  std::string rule;                          // "" (no split names), "shards", "folder names", "file names"
  std::vector<std::string> names;            // train, validation, test (those found), then others sorted
  // Each split's files (and the directory's skipped files); with split names its `path`, for messages,
  // is "<path> split <name>".
  std::map<std::string, DataListing> split;
  std::vector<std::string> outside;          // data files in no split, relative to `path`

  bool has(const std::string& name) const { return split.count(name) > 0; }
  // "train (2 files), test (1 file)"
  std::string found() const;
  // Split `name`; Error(Input) "KEY NAME: data directory PATH has no split NAME (splits found: ...)".
  const DataListing& get(const std::string& name, const std::string& key) const;
  // What choosing split `name` with option `key` reads, for the line that says so: "has splits train
  // (1 file), test (1 file) (by file names): KEY NAME; in no split, not read: README.md"; "" without
  // split names.
  std::string chosen(const std::string& key, const std::string& name) const;
  // The split to validate on: `wanted` when not "" (get() refuses a missing one); else validation,
  // else test, never `except` (the split trained on); "" when there is none or `wanted` is "none".
  std::string validation(const std::string& wanted, const std::string& key, const std::string& except) const;
};

// The splits of a data path (a directory, or a file: one split, train) with data.format `format`.
// Error(Input) as list_data, and for a save_to_disk DatasetDict.
Splits find_splits(const std::string& path, DataFormat format = DataFormat::Auto);

}  // namespace tessera::data
