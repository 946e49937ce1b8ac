// A user's program: built against lockstep as a subproject or as an installed package.
#include <lockstep/lockstep.hpp>

#include <cstdio>

static_assert(LOCKSTEP_VERSION_MAJOR >= 0 && LOCKSTEP_VERSION_MINOR >= 0 &&
              LOCKSTEP_VERSION_PATCH >= 0);

int main() {
  lockstep::State state;
  for (int round = 0; round < 100; ++round) {
    state.wait_for_everyone();
  }
  auto answer = state.on_main_process([] { return 42; })();
  std::printf("consumer: process %d of %d (lockstep %s)%s\n", state.process_index(),
              state.num_processes(), LOCKSTEP_VERSION_STRING,
              answer ? ", main process answered 42" : "");
  state.wait_for_everyone();
  return 0;
}
