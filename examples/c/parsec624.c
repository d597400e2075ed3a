/* parsec624.c: the graph of PaRSEC issue #624 through the C ABI alone, the way a task
 * runtime's remote-dependency layer drives it.
 *
 *   start(0) -> A -> task_x(1), task_y(2)
 *   start(0) -> B -> task_y(2)
 *
 * Tile i is owned by rank i, on 3 ranks. Rank 0 runs start(0) and sends its outputs as
 * ONE broadcast: the task's key, a header holding the task class and its parameters,
 * A to {1, 2} and B to {2}, over the chain 0 -> 1 -> 2 (the merged tree in which rank 1
 * must forward B, which it does not need itself: the shape #624 breaks). The outputs
 * are the root's own buffers, lent with a release callback (no copy). Ranks 1 and 2
 * learn of the task only from their FT_EVENT_ARRIVED (its header names the successor
 * to schedule) and have each output land in their own memory: an allocation hook
 * (ft_set_allocator) gives a buffer of the runtime's arena per output, which
 * ft_bcast_take hands back, and the library releases it once. Every rank prints
 * its line ("0: have A and B", "1: have A", "2: have A and B"), then a global
 * validation is the closing barrier. Each root buffer is released exactly once, and
 * over MPI and libfabric no payload byte was copied at any rank (ft_bcast_copies).
 *
 * Three builds:
 *   - with -DFT_MPI: one rank of `mpiexec --with-ft ulfm -n 3 ./parsec624_mpi`;
 *   - with -DFT_OFI: one rank over libfabric, `ftrun -n 3 -- ./parsec624_ofi`;
 *   - without: the 3 ranks simulated in this process (one thread each).
 * Build (from the repository root, after `cargo build --release -p ft-capi`, with
 * `--features mpi` for the MPI build):
 *   cc -Wall -Wextra -O2 examples/c/parsec624.c -Ift-capi/include -Ltarget/release \
 *      -lft -Wl,-rpath,$PWD/target/release -lpthread -o parsec624
 *   mpicc -Wall -Wextra -O2 -DFT_MPI examples/c/parsec624.c -Ift-capi/include \
 *      -Ltarget/release -lft -Wl,-rpath,$PWD/target/release -o parsec624_mpi
 * and `-DFT_OFI` (library built with `--features ofi`) for parsec624_ofi.
 */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(FT_MPI)
#include <mpi.h>
#endif

#include "ft.h"
#include "check.h"

#define RANKS 3


/* The runtime's task classes, and the key it gives a task: class and parameter. */
enum task_class { CLASS_START = 1, CLASS_TASK_X = 2, CLASS_TASK_Y = 3 };
#define TASK_KEY(class, k) (((uint64_t)(class) << 32) | (uint32_t)(k))

/* What the runtime puts in an activation: the finished task and its outputs' names. */
struct activation_header {
    uint32_t task_class;
    int32_t k;
    uint32_t noutputs;
    char names[2];
};

/* Outputs A and B: sizes past the transports' small-message copy (4 KiB), B in
 * several chunks. */
#define A_BYTES (64u << 10)
#define B_BYTES (300u << 10)

static uint8_t byte_of(int output, uint64_t i) {
    return (uint8_t)(output * 101 + i * 7 + (i >> 12));
}

/* The root's release callback: counts each buffer given back. */
static atomic_int releases[2];

static void release_output(void *arg, const uint8_t *data, uint64_t bytes) {
    (void)data;
    (void)bytes;
    atomic_fetch_add(&releases[(intptr_t)arg], 1);
}

/* A destination's arena: the runtime's memory outputs land in (one buffer each). */
#define ARENA_SLOTS 4
struct arena {
    pthread_mutex_t lock;
    uint8_t *given[ARENA_SLOTS];
    uint64_t bytes[ARENA_SLOTS];
    int lent, returned;
};
static struct arena arenas[RANKS];

static uint8_t *arena_alloc(void *arg, uint32_t root, uint64_t key, uint32_t output,
                            uint64_t bytes) {
    struct arena *a = arg;
    (void)root;
    (void)key;
    (void)output;
    pthread_mutex_lock(&a->lock);
    uint8_t *data = NULL;
    if (a->lent < ARENA_SLOTS && (data = malloc(bytes)) != NULL) {
        a->given[a->lent] = data;
        a->bytes[a->lent] = bytes;
        a->lent++;
    }
    pthread_mutex_unlock(&a->lock);
    return data; /* NULL: the library's own memory */
}

static void arena_release(void *arg, const uint8_t *data, uint64_t bytes) {
    struct arena *a = arg;
    pthread_mutex_lock(&a->lock);
    int found = 0;
    for (int i = 0; i < a->lent; i++) {
        if (a->given[i] == data && a->bytes[i] == bytes) found = 1;
    }
    assert(found);
    a->returned++;
    pthread_mutex_unlock(&a->lock);
    free((void *)data);
}

/* Whether `data` is a buffer the arena lent, of `bytes` bytes. */
static int arena_holds(struct arena *a, const uint8_t *data, uint64_t bytes) {
    pthread_mutex_lock(&a->lock);
    int found = 0;
    for (int i = 0; i < a->lent; i++) {
        if (a->given[i] == data && a->bytes[i] == bytes) found = 1;
    }
    pthread_mutex_unlock(&a->lock);
    return found;
}

static void print_line(uint32_t me, int have_a, int have_b) {
    if (have_a && have_b) {
        printf("%u: have A and B\n", me);
    } else if (have_a) {
        printf("%u: have A\n", me);
    } else {
        printf("%u: have B\n", me);
    }
    fflush(stdout);
}

/* Rank 0: start(0) finished; its outputs leave as one broadcast. */
static void run_start(ft_handle *h, uint8_t *a, uint8_t *b) {
    for (uint64_t i = 0; i < A_BYTES; i++) a[i] = byte_of(0, i);
    for (uint64_t i = 0; i < B_BYTES; i++) b[i] = byte_of(1, i);
    uint32_t a_dests[2] = {1, 2}, b_dests[1] = {2};
    ft_bcast_output outputs[2] = {
        {.data = a, .bytes = A_BYTES, .dests = a_dests, .ndests = 2,
         .release = release_output, .release_arg = (void *)(intptr_t)0},
        {.data = b, .bytes = B_BYTES, .dests = b_dests, .ndests = 1,
         .release = release_output, .release_arg = (void *)(intptr_t)1},
    };
    struct activation_header header = {CLASS_START, 0, 2, {'A', 'B'}};
    CHECK(ft_bcast_start(h, TASK_KEY(CLASS_START, 0), (const uint8_t *)&header,
                         sizeof header, FT_TOPO_CHAIN, 0, FT_STRATEGY_FETCH_FOR_DESCENDANTS, 2,
                         outputs));
    print_line(0, 1, 1);
}

/* Ranks 1 and 2: wait for an activation, schedule the successor it names, take its
 * inputs. */
static void run_successor(ft_handle *h, uint32_t me) {
    ft_event ev;
    do {
        CHECK(ft_next_event(h, &ev, 60000));
        if (ev.kind != FT_EVENT_ARRIVED) CHECK(ft_event_done(h, &ev));
    } while (ev.kind != FT_EVENT_ARRIVED);
    struct activation_header header;
    assert(ev.header_len == sizeof header);
    memcpy(&header, ev.header, sizeof header);
    assert(header.task_class == CLASS_START && header.k == 0 && header.noutputs == 2);
    assert(ev.root == 0 && ev.key == TASK_KEY(CLASS_START, header.k));
    /* start(0)'s successor on this rank: task_x(1) needs A, task_y(2) needs A and B. */
    const uint32_t successor = me == 1 ? CLASS_TASK_X : CLASS_TASK_Y;
    assert(ev.noutputs == (successor == CLASS_TASK_X ? 1u : 2u));
    int have[2] = {0, 0};
    for (uint32_t i = 0; i < ev.noutputs; i++) {
        uint32_t j = ev.outputs[i];
        assert(j < header.noutputs);
        ft_buffer input;
        CHECK(ft_bcast_take(h, ev.root, ev.key, j, &input, 60000));
        assert(input.len == (j == 0 ? A_BYTES : B_BYTES));
        assert(arena_holds(&arenas[me], input.data, input.len));
        for (uint64_t k = 0; k < input.len; k++) assert(input.data[k] == byte_of((int)j, k));
        have[j] = 1;
        CHECK(ft_buffer_free(&input));
    }
    CHECK(ft_event_done(h, &ev));
    print_line(me, have[0], have[1]);
}

/* One rank's part; the closing validation is the barrier before anyone releases. */
static void run_rank(ft_handle *h, uint32_t me, int check_copies) {
    static uint8_t a[A_BYTES], b[B_BYTES];
    uint32_t num_failed, num_new;
    if (me != 0) {
        pthread_mutex_init(&arenas[me].lock, NULL);
        CHECK(ft_set_allocator(h, arena_alloc, arena_release, &arenas[me]));
    }
    /* A validation is the barrier after which the root sends: every destination's
     * allocator is in place before any of its data can arrive. */
    CHECK(ft_validate_global(h, &num_failed, &num_new));
    assert(num_failed == 0);
    if (me == 0) {
        run_start(h, a, b);
    } else {
        run_successor(h, me);
    }
    CHECK(ft_validate_global(h, &num_failed, &num_new));
    assert(num_failed == 0);
    ft_copies copies;
    CHECK(ft_bcast_copies(h, &copies));
    assert(copies.api_copied == 0);
    if (check_copies) {
        if (copies.sent_copied != 0 || copies.received_copied != 0) {
            fprintf(stderr, "rank %u copied %llu bytes sending, %llu receiving\n", me,
                    (unsigned long long)copies.sent_copied,
                    (unsigned long long)copies.received_copied);
            exit(1);
        }
    }
    CHECK(ft_bcast_release(h, 0, TASK_KEY(CLASS_START, 0)));
}

/* Once the handle is closed: the root's buffers came back once each, and every
 * buffer a destination's arena lent (one per output it received) came back once. */
static void check_released(uint32_t me) {
    if (me == 0) {
        assert(releases[0] == 1 && releases[1] == 1);
    } else {
        assert(arenas[me].lent == 2); /* rank 1 relays B in the chain */
        assert(arenas[me].returned == arenas[me].lent);
    }
}

#if defined(FT_MPI)

int main(int argc, char **argv) {
    int provided, me, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != RANKS || provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "run on %d ranks of an MPI with thread support\n", RANKS);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    ft_handle *h;
    CHECK(ft_open_mpi(MPI_COMM_WORLD, 50, 2000, &h));
    run_rank(h, (uint32_t)me, 1);
    CHECK(ft_close(h));
    check_released((uint32_t)me);
    MPI_Finalize();
    return 0;
}

#elif defined(FT_OFI)

int main(void) {
    ft_handle *h;
    CHECK(ft_open_ofi_env(50, 2000, &h));
    uint32_t me, size;
    CHECK(ft_rank(h, &me, &size));
    if (size != RANKS) {
        fprintf(stderr, "run on %d ranks: ftrun -n %d -- ./parsec624_ofi\n", RANKS, RANKS);
        return 2;
    }
    run_rank(h, me, 1);
    CHECK(ft_close(h));
    check_released(me);
    return 0;
}

#else

struct rank_arg {
    ft_handle *h;
    uint32_t me;
};

static void *rank_thread(void *arg) {
    struct rank_arg *r = arg;
    run_rank(r->h, r->me, 0);
    return NULL;
}

int main(void) {
    ft_sim *group;
    CHECK(ft_sim_open(RANKS, 20, 1000, &group));
    pthread_t threads[RANKS];
    struct rank_arg args[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        args[r] = (struct rank_arg){ft_sim_rank(group, r), r};
        pthread_create(&threads[r], NULL, rank_thread, &args[r]);
    }
    for (uint32_t r = 0; r < RANKS; r++) pthread_join(threads[r], NULL);
    CHECK(ft_sim_close(group));
    for (uint32_t r = 0; r < RANKS; r++) check_released(r);
    return 0;
}

#endif
