// A kernel's name for the emulator's messages, from its address: the dynamic symbol table
// (dladdr) names exported functions only, and kernels are mostly internal (templates in
// anonymous namespaces), so the object's full symbol table (.symtab, present unless the
// binary is stripped) is read too.
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "internal.h"

namespace ampgrad::emu::detail {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  return s;
}

/// The name of the function symbol of the ELF file `path` that contains `value` (the
/// address as the file's symbols count it), or "".
std::string symtab_lookup(const std::string& path, uint64_t value) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string found;
  if (fstat(fd, &st) == 0 && size_t(st.st_size) >= sizeof(Elf64_Ehdr)) {
    const size_t size = size_t(st.st_size);
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      const auto* base = static_cast<const unsigned char*>(map);
      const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
      const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
                      eh->e_shoff > 0 && eh->e_shoff + uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr) <= size;
      if (ok) {
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
        for (int i = 0; i < eh->e_shnum && found.empty(); ++i) {
          if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
          const Elf64_Shdr& strs = sh[sh[i].sh_link];
          if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
          const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
          const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
          for (size_t k = 0; k < n; ++k) {
            const Elf64_Sym& s = syms[k];
            if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_name >= strs.sh_size) continue;
            if (value >= s.st_value && value < s.st_value + (s.st_size ? s.st_size : 1)) {
              found = reinterpret_cast<const char*>(base + strs.sh_offset + s.st_name);
              break;
            }
          }
        }
      }
      munmap(map, size);
    }
  }
  close(fd);
  return found;
}

}  // namespace

std::string kernel_name(const void* kernel) {
  static std::mutex mu;
  static std::map<const void*, std::string> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(kernel); it != known.end()) return it->second;
  std::string name;
  Dl_info info{};
  if (dladdr(kernel, &info)) {
    if (info.dli_sname && info.dli_saddr == kernel) {
      name = demangle(info.dli_sname);
    } else {
      // the main program's map has no file name; a position-independent object's symbols
      // count from where it is loaded, a fixed executable's are addresses
      const std::string file = info.dli_fname && *info.dli_fname ? info.dli_fname : "/proc/self/exe";
      const auto* eh = static_cast<const Elf64_Ehdr*>(info.dli_fbase);
      const uint64_t at = uint64_t(reinterpret_cast<uintptr_t>(kernel));
      const uint64_t value =
          eh && eh->e_type == ET_DYN ? at - uint64_t(reinterpret_cast<uintptr_t>(info.dli_fbase)) : at;
      const std::string raw = symtab_lookup(file, value);
      if (!raw.empty()) name = demangle(raw.c_str());
    }
  }
  if (name.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "at %p", kernel);
    name = buf;
  }
  known.emplace(kernel, name);
  return name;
}

}  // namespace ampgrad::emu::detail
