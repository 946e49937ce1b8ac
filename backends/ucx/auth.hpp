// Proving that a joining node holds the job's secret, without sending it (internal).
//
// HMAC-SHA-256 from OpenSSL's libcrypto, opened at run time (libcrypto.so.3, which every Debian
// system has: a single-node job never loads it); nonces from the kernel (getrandom).
//
// The join (rendezvous.hpp): the joining node sends a fresh nonce Nc; node 0 answers with its
// nonce Ns and MAC(secret, "lockstep node 0" | Nc | Ns); the node checks it (node 0 knows the
// secret) and sends MAC(secret, "lockstep node" | Nc | Ns); node 0 checks it before it reads
// anything else from the node. Every later message of the exchange (the hello, node 0's answer)
// carries MAC(secret, label | Nc | Ns | message), so that nobody can splice one in.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace lockstep::detail::auth {

inline constexpr std::size_t kNonce = 32;
inline constexpr std::size_t kMac = 32;
using Nonce = std::array<std::byte, kNonce>;
using Mac = std::array<std::byte, kMac>;

// A fresh nonce from getrandom; SystemError when the kernel gives none.
Nonce fresh_nonce();

// Plain HMAC-SHA-256 (RFC 2104) of `data` under `key` (its known answers are in RFC 4231).
Mac hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data);

// HMAC-SHA-256 under `key` of `parts`, each prefixed with its length (no two lists of parts give
// the same input). ConfigError when libcrypto cannot be opened.
Mac mac(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts);

// Whether `a` and `b` are equal, in time that does not depend on where they differ.
bool same(std::span<const std::byte> a, std::span<const std::byte> b);

// One exchange's keys: the secret and both nonces.
struct Session {
  std::span<const std::byte> secret;
  Nonce client{};
  Nonce server{};

  // The proof of the side named `role` ("lockstep node 0", "lockstep node").
  [[nodiscard]] Mac proof(std::string_view role) const;
  // The MAC that travels after `message`, labelled by what it is ("hello", "answer").
  [[nodiscard]] Mac seal(std::string_view label, std::span<const std::byte> message) const;
};

}  // namespace lockstep::detail::auth
