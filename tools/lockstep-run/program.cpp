// What the program is (program.hpp): its ELF dynamic section, read without loading it.
#include "program.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.hpp"

#include "base/proc.hpp"  // error_text
#include "options.hpp"    // split

namespace lockstep::run {

namespace {

// Why the file at `path` cannot be executed; empty when it can.
std::optional<std::string> why_not_executable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return lockstep::detail::error_text(errno);
  }
  if (S_ISDIR(st.st_mode)) {
    return std::string("is a directory");
  }
  if (::access(path.c_str(), X_OK) != 0) {
    return lockstep::detail::error_text(errno);
  }
  return std::nullopt;
}

// The path execvp would run for `program`: itself when it names a path, else the first entry of
// PATH where it can be executed; empty when none.
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return program;
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe)
  for (const std::string& dir : split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (!why_not_executable(candidate)) {
      return candidate;
    }
  }
  return "";
}

bool read_at(int fd, void* into, std::size_t size, off_t at) {
  return ::pread(fd, into, size, at) == static_cast<ssize_t>(size);
}

// The DT_NEEDED names of a 64-bit little-endian ELF file (what this machine runs).
std::vector<std::string> needed_libraries(int fd, off_t file_size) {
  Elf64_Ehdr header{};
  if (!read_at(fd, &header, sizeof header, 0) ||
      std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum > 256) {
    return {};
  }
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  if (!read_at(fd, segments.data(), segments.size() * sizeof(Elf64_Phdr),
               static_cast<off_t>(header.e_phoff))) {
    return {};
  }
  // A virtual address as a file offset, through the loadable segment that holds it.
  auto offset_of = [&](Elf64_Addr address) -> std::optional<off_t> {
    for (const auto& segment : segments) {
      if (segment.p_type == PT_LOAD && address >= segment.p_vaddr &&
          address < segment.p_vaddr + segment.p_filesz) {
        return static_cast<off_t>(segment.p_offset + (address - segment.p_vaddr));
      }
    }
    return std::nullopt;
  };
  std::vector<std::string> names;
  for (const auto& segment : segments) {
    if (segment.p_type != PT_DYNAMIC || segment.p_filesz > (1U << 20)) {
      continue;
    }
    std::vector<Elf64_Dyn> entries(segment.p_filesz / sizeof(Elf64_Dyn));
    if (!read_at(fd, entries.data(), entries.size() * sizeof(Elf64_Dyn),
                 static_cast<off_t>(segment.p_offset))) {
      return {};
    }
    std::optional<off_t> strings;
    for (const auto& entry : entries) {
      if (entry.d_tag == DT_STRTAB) {
        strings = offset_of(entry.d_un.d_ptr);
      }
    }
    if (!strings) {
      return {};
    }
    for (const auto& entry : entries) {
      if (entry.d_tag != DT_NEEDED) {
        continue;
      }
      char name[256] = {};
      const off_t at = *strings + static_cast<off_t>(entry.d_un.d_val);
      if (at >= file_size || ::pread(fd, name, sizeof name - 1, at) <= 0) {
        continue;
      }
      names.emplace_back(name);
    }
  }
  return names;
}

}  // namespace

std::optional<std::string> cannot_execute(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return why_not_executable(program);
  }
  if (resolve(program).empty()) {
    return std::string("not found in PATH");
  }
  return std::nullopt;
}

std::optional<std::string> linked_mpi(const std::string& program) {
  const std::string path = resolve(program);
  if (path.empty()) {
    return std::nullopt;
  }
  const lockstep::detail::UniqueFd owned(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!owned) {
    return std::nullopt;
  }
  const int fd = owned.get();
  struct stat info {};
  std::vector<std::string> names;
  if (::fstat(fd, &info) == 0 && S_ISREG(info.st_mode)) {
    names = needed_libraries(fd, info.st_size);
  }
  for (const auto& name : names) {
    if (name.starts_with("libmpi.so") || name.starts_with("libmpich.so")) {
      return name;
    }
  }
  return std::nullopt;
}

}  // namespace lockstep::run
