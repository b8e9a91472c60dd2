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

}  // namespace tessera::util
