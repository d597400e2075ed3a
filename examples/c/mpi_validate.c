/* mpi_validate.c: what a runtime over MPI (PaRSEC, an MPI library's own layers)
 * copies. Each rank opens the library over the application's communicator; one rank
 * is killed for real (SIGKILL); the survivors validate globally and print G. With
 * `--no-kill`, nobody dies and every rank prints G = [] (the run any MPI passes).
 *
 * The kill needs an MPI whose survivors go on after a process dies: Open MPI 5 with
 * ULFM (MPICH 5's launcher ends the job instead).
 * Build (after `cargo build --release -p ft-capi --features mpi`, which needs MPICC):
 *   mpicc -Wall -Wextra -O2 -DFT_MPI examples/c/mpi_validate.c -Ift-capi/include \
 *         -Ltarget/release -lft -Wl,-rpath,$PWD/target/release -o mpi_validate
 * Run:
 *   mpiexec --with-ft ulfm --oversubscribe -n 4 ./mpi_validate
 *   mpiexec -n 4 ./mpi_validate --no-kill
 */
#include <assert.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "ft.h"
#include "check.h"


int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "this MPI offers no thread support for the progress thread\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int me, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int kill = !(argc > 1 && strcmp(argv[1], "--no-kill") == 0);
    const int victim = size - 1;

    /* Collective over the application's communicator (the library duplicates it). */
    ft_handle *h;
    CHECK(ft_open_mpi(MPI_COMM_WORLD, 20, 1000, &h));

    /* A first validation: nobody failed. */
    uint32_t num_failed, num_new;
    CHECK(ft_validate_global(h, &num_failed, &num_new));
    assert(num_failed == 0 && num_new == 0);

    if (!kill) {
        CHECK(ft_validate_global(h, &num_failed, &num_new));
        assert(num_failed == 0 && num_new == 0);
        printf("rank %d: G = [] (num_failed=0 num_new=0)\n", me);
        fflush(stdout);
        CHECK(ft_close(h));
        MPI_Finalize();
        return 0;
    }
    if (me == victim) {
        raise(SIGKILL); /* a real crash: no goodbye to anyone */
    }

    /* The survivors: wait (bounded) for the detector, then agree on G. */
    for (int tries = 0;; tries++) {
        CHECK(ft_validate_local(h, &num_failed, &num_new));
        if (num_failed > 0) break;
        if (tries > 3000) {
            fprintf(stderr, "rank %d: the death was never detected\n", me);
            return 1;
        }
        usleep(10000);
    }
    CHECK(ft_validate_global(h, &num_failed, &num_new));
    assert(num_failed == 1 && num_new == 1);

    ft_rank_info g[1];
    uint32_t count;
    int rc = ft_get_state(h, FT_SCOPE_GLOBAL, FT_STATE_FAILED | FT_STATE_NULL, 0, &count, NULL);
    assert(rc == FT_ERR_SIZE && count == 1);
    CHECK(ft_get_state(h, FT_SCOPE_GLOBAL, FT_STATE_FAILED | FT_STATE_NULL, 1, &count, g));
    assert(count == 1 && g[0].rank == (uint32_t)victim);
    printf("rank %d: G = [%u] (num_failed=%u num_new=%u)\n", me, g[0].rank, num_failed,
           num_new);
    fflush(stdout);

    CHECK(ft_close(h));
    /* Open MPI 5 may wait forever in MPI_Finalize for the dead process (its PMIx fence,
     * open-mpi/ompi#11404): a survivor that saw a failure exits without finalizing. */
    _exit(0);
}
