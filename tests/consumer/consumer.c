/* A C user's program, built against the installed package with pkg-config. */
#include <lockstep/lockstep.h>
#include <stdio.h>

int main(void) {
  lockstep_state* state = NULL;
  if (lockstep_state_create(&state) != LOCKSTEP_OK ||
      lockstep_wait_for_everyone(state) != LOCKSTEP_OK) {
    fprintf(stderr, "c consumer: %s\n", lockstep_last_error());
    return 1;
  }
  printf("c consumer: process %d of %d (lockstep %s)\n", lockstep_process_index(state),
         lockstep_num_processes(state), lockstep_version());
  lockstep_state_destroy(state);
  return 0;
}
