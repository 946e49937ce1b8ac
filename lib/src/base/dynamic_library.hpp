// Looking up a library's entry points after dlopen (internal).
#pragma once

#include <dlfcn.h>

#include <string>

#include "lockstep/error.hpp"

namespace lockstep::detail {

// Sets `function` to `library`'s symbol `name`; ConfigError naming `what` (the library and the
// version it must have) when there is none.
template <class F>
void bind_symbol(void* library, const char* name, F& function, const char* what) {
  function = reinterpret_cast<F>(::dlsym(library, name));
  if (function == nullptr) {
    throw ConfigError(std::string("lockstep: ") + what + " has no " + name);
  }
}

}  // namespace lockstep::detail
