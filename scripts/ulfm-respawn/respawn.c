/*
 * Measures whether ULFM survivors can respawn a killed rank under Open MPI's PRRTE:
 * the last rank of the job kills itself, the survivors shrink the world, spawn one
 * process, merge with it and renumber so that it takes the dead rank's number, then
 * all of them reduce the replacement's rank over the rebuilt communicator. Rank 0
 * prints one JSON line: {"ok":true,"ranks":N,"respawned_as":R,"seconds":S,"spawn_seconds":P}
 * (S from the kill to the end of that reduction, P from the call to MPI_Comm_spawn),
 * or {"ok":false,"step":"...","error":"..."} at the first step that failed.
 */
#include <mpi.h>
#include <mpi-ext.h>
#include <signal.h>
#include <stdio.h>

static int report_failure(int rank, const char *step, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    if (rank == 0)
        printf("{\"ok\":false,\"step\":\"%s\",\"error\":\"%s\"}\n", step, text);
    fflush(stdout);
    MPI_Finalize();
    return 1;
}

/* The spawned process: merges with the survivors and takes the dead rank's number. */
static int replacement(MPI_Comm parent)
{
    MPI_Comm merged, rebuilt;
    int victim = 0;
    MPI_Intercomm_merge(parent, 1, &merged);
    MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    MPI_Bcast(&victim, 1, MPI_INT, 0, merged);
    MPI_Comm_split(merged, 0, victim, &rebuilt);
    int mine = 0, replaced = 0;
    MPI_Comm_rank(rebuilt, &mine);
    MPI_Allreduce(&mine, &replaced, 1, MPI_INT, MPI_MAX, rebuilt);
    MPI_Comm_free(&rebuilt);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Comm parent, world, shrunk, inter, merged, rebuilt;
    int rank, size, rc, flag = 1, errcode = MPI_SUCCESS, new_rank = -1;
    double killed_at;

    MPI_Init(&argc, &argv);
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL)
        return replacement(parent);

    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    const int victim = size - 1;
    MPI_Barrier(world);
    killed_at = MPI_Wtime();
    if (rank == victim)
        raise(SIGKILL);

    /* Every survivor learns of the death (agree fails or returns), then they shrink. */
    MPIX_Comm_agree(world, &flag);
    rc = MPIX_Comm_shrink(world, &shrunk);
    if (rc != MPI_SUCCESS)
        return report_failure(rank, "MPIX_Comm_shrink", rc);
    MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
    double spawned_at = MPI_Wtime();
    rc = MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0, shrunk, &inter,
                        &errcode);
    if (rc != MPI_SUCCESS)
        return report_failure(rank, "MPI_Comm_spawn", rc);
    rc = MPI_Intercomm_merge(inter, 0, &merged);
    if (rc != MPI_SUCCESS)
        return report_failure(rank, "MPI_Intercomm_merge", rc);
    MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    int key = victim;
    MPI_Bcast(&key, 1, MPI_INT, 0, merged);
    /* Survivors keep their numbers; the replacement's key is the dead rank's. */
    rc = MPI_Comm_split(merged, 0, rank, &rebuilt);
    if (rc != MPI_SUCCESS)
        return report_failure(rank, "MPI_Comm_split", rc);
    int none = -1;
    rc = MPI_Allreduce(&none, &new_rank, 1, MPI_INT, MPI_MAX, rebuilt);
    if (rc != MPI_SUCCESS)
        return report_failure(rank, "MPI_Allreduce", rc);
    double seconds = MPI_Wtime() - killed_at, spawn_seconds = MPI_Wtime() - spawned_at;
    int rebuilt_size = 0;
    MPI_Comm_size(rebuilt, &rebuilt_size);
    if (rank == 0) {
        printf("{\"ok\":%s,\"ranks\":%d,\"respawned_as\":%d,\"seconds\":%.3f,"
               "\"spawn_seconds\":%.3f}\n",
               rebuilt_size == size && new_rank == victim ? "true" : "false", rebuilt_size,
               new_rank, seconds, spawn_seconds);
        fflush(stdout);
    }
    MPI_Comm_free(&rebuilt);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&inter);
    MPI_Comm_free(&shrunk);
    MPI_Finalize();
    return 0;
}
