// The job's secret (lib/src/secret.cpp) and the join's MAC (backends/ucx/auth.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "job/job_secret.hpp"
#include "lockstep/error.hpp"
#include "ucx/auth.hpp"

namespace {

namespace fs = std::filesystem;
using lockstep::detail::load_job_secret;

class Secret : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = fs::temp_directory_path() /
            ("lockstep-secret-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(home_);
    env_["HOME"] = home_.string();
  }
  void TearDown() override { fs::remove_all(home_); }

  lockstep::detail::EnvLookup lookup() const {
    return [env = env_](const std::string& name) -> std::optional<std::string> {
      auto found = env.find(name);
      return found == env.end() ? std::nullopt : std::optional(found->second);
    };
  }
  // The ConfigError's message, or "" when the secret loads.
  std::string error() const {
    try {
      (void)load_job_secret(lookup());
    } catch (const lockstep::ConfigError& e) {
      return e.what();
    }
    return "";
  }
  fs::path write(const std::string& name, const std::string& text, mode_t mode) const {
    fs::path path = home_ / name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }

  static inline int counter_ = 0;
  fs::path home_;
  std::map<std::string, std::string> env_;
};

TEST_F(Secret, TheVariableComesFirstAndMustBeLongEnough) {
  env_["LOCKSTEP_SECRET"] = "0123456789abcdef";
  EXPECT_EQ(load_job_secret(lookup()).bytes, "0123456789abcdef");
  EXPECT_EQ(load_job_secret(lookup()).source, "LOCKSTEP_SECRET");
  env_["LOCKSTEP_SECRET"] = "short";
  EXPECT_NE(error().find("LOCKSTEP_SECRET) has 5 bytes, fewer than 16"), std::string::npos)
      << error();
}

TEST_F(Secret, AFileMustBeOursRegularAndPrivate) {
  const auto good = write("good", "a secret of twenty bytes\n", 0600);
  env_["LOCKSTEP_SECRET_FILE"] = good.string();
  EXPECT_EQ(load_job_secret(lookup()).bytes, "a secret of twenty bytes");
  const auto open = write("open", "a secret of twenty bytes\n", 0644);
  env_["LOCKSTEP_SECRET_FILE"] = open.string();
  EXPECT_NE(error().find("may be read by others"), std::string::npos) << error();
  const fs::path link = home_ / "link";
  fs::create_symlink(good, link);
  env_["LOCKSTEP_SECRET_FILE"] = link.string();
  EXPECT_NE(error().find("symbolic link"), std::string::npos) << error();
  // A FIFO is refused without blocking (nobody writes to it).
  const fs::path fifo = home_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  env_["LOCKSTEP_SECRET_FILE"] = fifo.string();
  EXPECT_NE(error().find("not a regular file"), std::string::npos) << error();
  env_["LOCKSTEP_SECRET_FILE"] = (home_ / "missing").string();
  EXPECT_NE(error().find("does not exist"), std::string::npos) << error();
  const auto tiny = write("tiny", "abc\n", 0600);
  env_["LOCKSTEP_SECRET_FILE"] = tiny.string();
  EXPECT_NE(error().find("fewer than 16"), std::string::npos) << error();
}

// Issue 45's edges: a file written with a Windows line ending holds the same secret as one
// with a Unix one (not the secret plus '\r'), and only one line ending goes.
TEST_F(Secret, OneLineEndingGoesUnixOrWindows) {
  for (const char* ending : {"", "\n", "\r\n"}) {
    const auto file = write("crlf", std::string("a secret of twenty bytes") + ending, 0600);
    env_["LOCKSTEP_SECRET_FILE"] = file.string();
    EXPECT_EQ(load_job_secret(lookup()).bytes, "a secret of twenty bytes")
        << "ending " << fs::path(ending);
  }
  const auto two = write("two", "a secret of twenty bytes\n\n", 0600);
  env_["LOCKSTEP_SECRET_FILE"] = two.string();
  EXPECT_EQ(load_job_secret(lookup()).bytes, "a secret of twenty bytes\n");
}

// A relative XDG_CONFIG_HOME is ignored (the XDG spec says so): the key file is HOME's, wherever
// the process runs; an absolute one is used.
TEST_F(Secret, ARelativeXdgConfigHomeIsIgnored) {
  env_["XDG_CONFIG_HOME"] = "relative/config";
  EXPECT_EQ(load_job_secret(lookup()).source, (home_ / ".config" / "lockstep" / "secret").string());
  EXPECT_FALSE(fs::exists("relative"));
  env_["XDG_CONFIG_HOME"] = (home_ / "xdg").string();
  EXPECT_EQ(load_job_secret(lookup()).source, (home_ / "xdg" / "lockstep" / "secret").string());
}

TEST_F(Secret, TheUsersKeyFileIsCreatedOnceOwnerOnly) {
  const auto first = load_job_secret(lookup());
  const fs::path path = home_ / ".config" / "lockstep" / "secret";
  EXPECT_EQ(first.source, path.string());
  EXPECT_EQ(first.bytes.size(), 64U);  // 32 random bytes, hex
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  ASSERT_EQ(::stat(path.parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700U);
  EXPECT_EQ(load_job_secret(lookup()).bytes, first.bytes);
  // Nothing else is left in the folder (the temporary name is gone).
  EXPECT_EQ(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()), 1);
}

TEST_F(Secret, ProcessesThatCreateTheKeyFileAtOnceAgree) {
  constexpr int kProcesses = 8;
  std::vector<pid_t> pids;
  const fs::path out = home_ / "seen";
  fs::create_directories(out);
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::ofstream(out / std::to_string(i)) << load_job_secret(lookup()).bytes;
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const std::string expected = load_job_secret(lookup()).bytes;
  for (int i = 0; i < kProcesses; ++i) {
    std::ifstream in(out / std::to_string(i));
    std::string seen;
    in >> seen;
    EXPECT_EQ(seen, expected) << "process " << i;
  }
}

TEST(JoinMac, IsHmacSha256) {
  // RFC 4231, test case 2.
  const std::string key = "Jefe";
  const std::string data = "what do ya want for nothing?";
  const auto mac = lockstep::detail::auth::hmac_sha256(std::as_bytes(std::span(key)),
                                                       std::as_bytes(std::span(data)));
  std::string hex;
  for (std::byte b : mac) {
    const char* digits = "0123456789abcdef";
    hex += digits[std::to_integer<int>(b) >> 4];
    hex += digits[std::to_integer<int>(b) & 15];
  }
  EXPECT_EQ(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(JoinMac, ProofsDependOnRoleNoncesAndSecret) {
  using lockstep::detail::auth::Session;
  const std::string secret = "the job's secret, 32 bytes long!";
  const std::string other = "another secret, also long enough";
  Session a{std::as_bytes(std::span(secret)), lockstep::detail::auth::fresh_nonce(),
            lockstep::detail::auth::fresh_nonce()};
  Session b = a;
  EXPECT_TRUE(lockstep::detail::auth::same(a.proof("lockstep node"), b.proof("lockstep node")));
  EXPECT_FALSE(lockstep::detail::auth::same(a.proof("lockstep node"), a.proof("lockstep node 0")));
  b.server = lockstep::detail::auth::fresh_nonce();
  EXPECT_FALSE(lockstep::detail::auth::same(a.proof("lockstep node"), b.proof("lockstep node")));
  Session c = a;
  c.secret = std::as_bytes(std::span(other));
  EXPECT_FALSE(lockstep::detail::auth::same(a.proof("lockstep node"), c.proof("lockstep node")));
}

}  // namespace
