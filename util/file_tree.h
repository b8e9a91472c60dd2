// Removing and walking directory trees, on POSIX calls only.
//
// Why not std::filesystem::remove_all or recursive_directory_iterator: LibTorch wheels from 2.5 on
// (pytorch/pytorch#133437; the "work around" of 2.9 made them weak, still exported) carry their own
// statically linked copy of libstdc++'s recursive_directory_iterator and export it. In a program
// linked against such a LibTorch the dynamic linker binds libstdc++'s own calls to that copy, so
// fs::remove_all (built on the iterator) jumps into code of another libstdc++ version: on an H200
// machine with torch 2.11 it called address 0 (a checkpoint directory's cleanup). The calls here
// cannot be interposed that way. unit.architecture checks that no C++ file of the tree uses the two.
#pragma once
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace tessera::util {

// Removes `path` and, for a directory, everything below it; a symbolic link is removed, never
// followed. Returns how many entries were removed (0 when `path` does not exist). On an error sets
// `ec` and returns UINTMAX_MAX, with whatever was removed so far gone (as fs::remove_all(p, ec)).
std::uintmax_t remove_tree(const std::string& path, std::error_code& ec);
// The same, throwing std::filesystem::filesystem_error naming `path` on an error.
std::uintmax_t remove_tree(const std::string& path);

// The regular files below `dir`, recursively, following symbolic links to directories (a directory
// already being walked is not entered again), in sorted path order. With skip_hidden, entries whose
// names start with '.' are skipped, directories with their contents. On an error sets `ec` and
// returns what it found.
std::vector<std::string> files_below(const std::string& dir, std::error_code& ec, bool skip_hidden = true);

// A walk of `dir` as files_below's, confined to it: a symbolic link whose target (resolved, links
// and ".." followed) lies outside `dir` is not followed but listed, and entries that are neither
// regular files nor directories (FIFOs, sockets, devices) are listed, never opened.
struct TreeListing {
  std::vector<std::string> files;                                  // regular files, sorted
  std::vector<std::string> specials;                               // FIFOs, sockets, devices, sorted
  std::vector<std::pair<std::string, std::string>> outside_links;  // (link, its resolved target), sorted
};
TreeListing list_tree(const std::string& dir, std::error_code& ec, bool skip_hidden = true);

// What `path` is when it is not a regular file -- "a FIFO", "a socket", "a character device", "a block
// device" -- found by stat (links followed) without opening it (opening a FIFO blocks until a writer
// comes); "" for a regular file, a directory or a path that cannot be stat'ed.
std::string special_file_kind(const std::string& path);
// "WHAT PATH is a FIFO, not a regular file" for such a path, else "": the start of the one-line
// error with which data and checkpoint readers refuse it, before opening it.
std::string not_regular_file(const std::string& path, const std::string& what);

}  // namespace tessera::util
