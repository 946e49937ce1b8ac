#include "ucx/auth.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "base/proc.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail::auth {
namespace {

// The few libcrypto calls used, typed as OpenSSL 3 declares them (no OpenSSL header needed).
struct Crypto {
  const void* (*sha256)() = nullptr;  // EVP_sha256
  unsigned char* (*hmac)(const void*, const void*, int, const unsigned char*, std::size_t,
                         unsigned char*, unsigned int*) = nullptr;  // HMAC
  int (*memcmp)(const void*, const void*, std::size_t) = nullptr;   // CRYPTO_memcmp
  std::string why;                                                  // empty when loaded
};

Crypto load() {
  Crypto crypto;
  void* library = nullptr;
  for (const char* name : {"libcrypto.so.3", "libcrypto.so"}) {
    library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      break;
    }
  }
  if (library == nullptr) {
    crypto.why =
        "cannot open OpenSSL's libcrypto.so.3 (apt-get install libssl3), which "
        "authenticates the nodes of a multi-node job";
    return crypto;
  }
  crypto.sha256 = reinterpret_cast<decltype(crypto.sha256)>(::dlsym(library, "EVP_sha256"));
  crypto.hmac = reinterpret_cast<decltype(crypto.hmac)>(::dlsym(library, "HMAC"));
  crypto.memcmp = reinterpret_cast<decltype(crypto.memcmp)>(::dlsym(library, "CRYPTO_memcmp"));
  if (crypto.sha256 == nullptr || crypto.hmac == nullptr || crypto.memcmp == nullptr) {
    crypto.why = "OpenSSL's libcrypto lacks EVP_sha256, HMAC or CRYPTO_memcmp";
  }
  return crypto;
}

const Crypto& crypto() {
  static std::once_flag once;
  static const Crypto* loaded = nullptr;  // never destroyed: used until the process ends
  std::call_once(once,
                 [] { loaded = new Crypto(load()); });  // NOLINT(cppcoreguidelines-owning-memory)
  if (!loaded->why.empty()) {
    throw ConfigError("lockstep: " + loaded->why);
  }
  return *loaded;
}

std::span<const std::byte> text(std::string_view label) {
  return std::as_bytes(std::span(label.data(), label.size()));
}

}  // namespace

Nonce fresh_nonce() {
  Nonce nonce{};
  fill_random(nonce, "lockstep: a nonce for the join");
  return nonce;
}

Mac mac(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts) {
  std::vector<unsigned char> input;
  for (const auto& part : parts) {
    const auto length = static_cast<std::uint64_t>(part.size());
    for (int i = 0; i < 8; ++i) {
      input.push_back(static_cast<unsigned char>(length >> (8 * i)));
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(part.data());
    input.insert(input.end(), bytes, bytes + part.size());
  }
  return hmac_sha256(key, std::as_bytes(std::span(input)));
}

Mac hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data) {
  const Crypto& c = crypto();
  Mac out{};
  unsigned int length = 0;
  if (c.hmac(c.sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(),
             reinterpret_cast<unsigned char*>(out.data()), &length) == nullptr ||
      length != out.size()) {
    throw Error("lockstep: HMAC-SHA-256 failed in OpenSSL's libcrypto");
  }
  return out;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && crypto().memcmp(a.data(), b.data(), a.size()) == 0;
}

Mac Session::proof(std::string_view role) const {
  return mac(secret, {text(role), client, server});
}

Mac Session::seal(std::string_view label, std::span<const std::byte> message) const {
  return mac(secret, {text(label), client, server, message});
}

}  // namespace lockstep::detail::auth
