#include "elf_needed.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace strata {
namespace {

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_at(int fd, void* buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, off_t(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += size_t(r);
  }
  return true;
}

}  // namespace

std::vector<std::string> elf_needed(const std::string& path, std::string* why) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    *why = fmt::format("{}: cannot open ({})", path, std::strerror(errno));
    return {};
  }
  auto bad = [&](const char* what) {
    *why = fmt::format("{}: not a readable ELF64 shared object ({})", path, what);
    return std::vector<std::string>{};
  };
  Elf64_Ehdr eh;
  if (!read_at(f.fd, &eh, sizeof eh, 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB)
    return bad("header");
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > 4096)
    return bad("program headers");
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_at(f.fd, ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff))
    return bad("program headers");
  // The dynamic section holds the string table's address; the loadable segments map it back
  // to a file offset.
  const Elf64_Phdr* dyn = nullptr;
  for (const auto& p : ph)
    if (p.p_type == PT_DYNAMIC) dyn = &p;
  if (!dyn || dyn->p_filesz > (64u << 20)) return bad("no dynamic section");
  std::vector<Elf64_Dyn> entries(dyn->p_filesz / sizeof(Elf64_Dyn));
  if (!read_at(f.fd, entries.data(), entries.size() * sizeof(Elf64_Dyn), dyn->p_offset))
    return bad("dynamic section");
  uint64_t strtab = 0, strsz = 0;
  std::vector<uint64_t> needed;
  for (const auto& d : entries) {
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag == DT_STRTAB) strtab = d.d_un.d_ptr;
    if (d.d_tag == DT_STRSZ) strsz = d.d_un.d_val;
    if (d.d_tag == DT_NEEDED) needed.push_back(d.d_un.d_val);
  }
  uint64_t strtab_off = 0;
  bool mapped = false;
  for (const auto& p : ph)
    if (p.p_type == PT_LOAD && strtab >= p.p_vaddr && strtab < p.p_vaddr + p.p_filesz) {
      strtab_off = strtab - p.p_vaddr + p.p_offset;
      mapped = true;
    }
  if (!mapped || strsz == 0 || strsz > (64u << 20)) return bad("string table");
  std::string strings(strsz, '\0');
  if (!read_at(f.fd, strings.data(), strsz, strtab_off)) return bad("string table");
  std::vector<std::string> names;
  for (uint64_t off : needed) {
    if (off >= strsz) return bad("DT_NEEDED offset");
    names.emplace_back(strings.c_str() + off);  // c_str() ends in '\0' whatever the file holds
  }
  return names;
}

}  // namespace strata
