// The sonames an ELF shared object names as DT_NEEDED, read from its file without loading it:
// which CUDA libraries the backend module was linked against (libcudart.so.13, ...), so that
// strata looks for exactly those and states no version of its own.
#pragma once
#include <string>
#include <vector>

namespace strata {

// The DT_NEEDED entries of the ELF64 little-endian file at `path`, in order; on a file that
// cannot be read or is not such an object, an empty list with the reason in *why.
std::vector<std::string> elf_needed(const std::string& path, std::string* why);

}  // namespace strata
