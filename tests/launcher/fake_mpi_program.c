/* A program linked with the fake libmpi.so.40 (fake_mpi.c). */
int MPI_Init(int* argc, char*** argv);

int main(int argc, char** argv) {
  return MPI_Init(&argc, &argv);
}
