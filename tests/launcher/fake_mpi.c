/* A library named as Open MPI's (libmpi.so.40), for the launcher test that an MPI program
 * started by lockstep-run is told how to start it instead. */
int MPI_Init(int* argc, char*** argv);

int MPI_Init(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  return 0;
}
