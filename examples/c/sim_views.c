/* sim_views.c: the failure views of a group simulated in this process, from C.
 *
 * Five ranks; rank 4 is killed. Every survivor validates globally (each on its own
 * thread: validate_global is collective), then rank 0 prints its views, queries rank
 * states (first with a buffer too small: FT_ERR_SIZE names the count needed),
 * recognizes the dead rank, renumbers the shrunk group and shrinks into it (the
 * survivors validate there, in a group of their own), then broadcasts a buffer
 * from rank 0 to ranks 1 and 2 (copied), then lends one (sent in place, released once
 * through its callback though rank 3, a destination, is killed mid-broadcast). Along
 * the way each rank's event queue tells it what it
 * learned: the failed rank, the agreed G, the broadcast's arrival and its ready output
 * (the queue's descriptor polls readable while events wait). Asserts on every result.
 *
 * Build and run (from the repository root, after `cargo build --release -p ft-capi`):
 *   cc -Wall -Wextra -O2 examples/c/sim_views.c -Ift-capi/include \
 *      -Ltarget/release -lft -Wl,-rpath,$PWD/target/release -lpthread -o sim_views
 *   ./sim_views
 */
#include <assert.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ft.h"
#include "check.h"
#include "validation.h"

#define RANKS 5
#define VICTIM 4


/* How many times the lent buffer was given back. */
static atomic_int releases;

static void count_release(void *arg, const uint8_t *data, uint64_t bytes) {
    assert(arg == data && bytes == 200000);
    atomic_fetch_add(&releases, 1);
}

/* The next event of `h` (waiting at most 20 s), which must be of kind `kind`. Hand it to
 * ft_event_done once read. */
static ft_event next_event(ft_handle *h, uint32_t kind) {
    ft_event ev;
    CHECK(ft_next_event(h, &ev, 20000));
    if (ev.kind != kind) {
        fprintf(stderr, "event of kind %u where %u was expected\n", ev.kind, kind);
        exit(1);
    }
    return ev;
}

static int readable(int fd) {
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
}

static const char *state_name(uint32_t state) {
    return state == FT_STATE_OK ? "OK" : state == FT_STATE_FAILED ? "FAILED" : "NULL";
}

int main(void) {
    ft_sim *group;
    CHECK(ft_sim_open(RANKS, 20, 300, &group));
    ft_handle *me = ft_sim_rank(group, 0);
    assert(me != NULL && ft_sim_rank(group, RANKS) == NULL);

    CHECK(ft_sim_kill(group, VICTIM));
    /* Wait (bounded) until the detector's news reaches rank 0's local view. */
    uint32_t num_failed = 0, num_new = 0;
    for (int tries = 0; num_failed == 0; tries++) {
        assert(tries < 2000 && "rank 0 never learned of the death");
        usleep(5000);
        CHECK(ft_validate_local(me, &num_failed, &num_new));
    }
    printf("validate_local: num_failed=%u num_new=%u\n", num_failed, num_new);
    assert(num_failed == 1 && num_new == 1);
    ft_event ev = next_event(me, FT_EVENT_RANK_FAILED);
    assert(ev.rank == VICTIM);
    CHECK(ft_event_done(me, &ev));

    /* validate_global is collective: every survivor calls it. */
    pthread_t threads[RANKS - 1];
    struct validation v[RANKS - 1];
    for (uint32_t r = 0; r < RANKS - 1; r++) {
        v[r].h = ft_sim_rank(group, r);
        pthread_create(&threads[r], NULL, validate_global, &v[r]);
    }
    for (uint32_t r = 0; r < RANKS - 1; r++) {
        pthread_join(threads[r], NULL);
        CHECK(v[r].rc);
        assert(v[r].num_failed == 1 && v[r].num_new == 1);
    }
    printf("validate_global: num_failed=%u num_new=%u at every survivor\n", v[0].num_failed,
           v[0].num_new);
    /* Each survivor was told of the death once, then of the agreement. */
    for (uint32_t r = 0; r < RANKS - 1; r++) {
        ft_handle *h = ft_sim_rank(group, r);
        if (r != 0) {
            ev = next_event(h, FT_EVENT_RANK_FAILED);
            assert(ev.rank == VICTIM);
            CHECK(ft_event_done(h, &ev));
        }
        ev = next_event(h, FT_EVENT_VALIDATED);
        assert(ev.epoch == 1 && ev.nfailed == 1 && ev.failed[0] == VICTIM);
        assert(ev.nadded == 1 && ev.added[0] == VICTIM);
        CHECK(ft_event_done(h, &ev));
        CHECK(ft_event_done(h, &ev)); /* a second call frees nothing twice */
        assert(ev.failed == NULL && ev.storage == NULL);
        assert(ft_next_event(h, &ev, 0) == FT_ERR_TIMEOUT);
    }
    printf("events: every survivor was told of rank %u's death, then of G = [%u]\n", VICTIM,
           VICTIM);

    /* The views: every rank of each scope, with its state. */
    for (int scope = FT_SCOPE_LOCAL; scope <= FT_SCOPE_GLOBAL; scope++) {
        ft_rank_info infos[RANKS];
        uint32_t outcount;
        CHECK(ft_get_state(me, scope, FT_STATE_OK | FT_STATE_FAILED | FT_STATE_NULL, RANKS,
                           &outcount, infos));
        assert(outcount == RANKS);
        printf("%s view:", scope == FT_SCOPE_LOCAL ? "local " : "global");
        for (uint32_t k = 0; k < outcount; k++)
            printf(" %u:%s", infos[k].rank, state_name(infos[k].state));
        printf("\n");
    }

    /* A buffer too small: FT_ERR_SIZE, the count needed in outcount, infos untouched. */
    ft_rank_info small[1] = {{99, 99, 99, 99}};
    uint32_t outcount = 0;
    int rc = ft_get_state(me, FT_SCOPE_GLOBAL, FT_STATE_OK, 1, &outcount, small);
    printf("get_state(OK) into 1 entry: %s (needs %u)\n", ft_strerror(rc), outcount);
    assert(rc == FT_ERR_SIZE && outcount == RANKS - 1);
    assert(small[0].rank == 99 && small[0].state == 99 && small[0].epoch == 99 &&
           small[0].generation == 99);

    /* The newly agreed failure, then recognized: FAILED becomes NULL. */
    ft_rank_info failed[1];
    CHECK(ft_get_state(me, FT_SCOPE_GLOBAL, FT_STATE_FAILED | FT_STATE_NEW, 1, &outcount,
                       failed));
    assert(outcount == 1 && failed[0].rank == VICTIM && failed[0].epoch == 1 &&
           failed[0].generation == 0);
    CHECK(ft_recognize(me, VICTIM));
    assert(ft_recognize(me, 1) == FT_ERR_NOT_FAILED);
    uint32_t nulls;
    CHECK(ft_num_state(me, FT_SCOPE_GLOBAL, FT_STATE_NULL, &nulls));
    assert(nulls == 1);

    /* Shrink: survivors keep their order; the dead rank has no new rank. */
    uint32_t new_rank;
    CHECK(ft_shrink_rank(me, 3, &new_rank));
    assert(new_rank == 3 && ft_shrink_rank(me, VICTIM, &new_rank) == FT_ERR_RANK);

    /* Shrink for real: every survivor opens a handle on the group without G, numbered in
     * order, with an empty view, over the same connections. The group validates on its
     * own; closing its handles leaves the old ones as they were. */
    ft_handle *shrunk[RANKS - 1];
    struct validation sv[RANKS - 1];
    pthread_t st[RANKS - 1];
    for (uint32_t r = 0; r < RANKS - 1; r++) {
        CHECK(ft_shrink(ft_sim_rank(group, r), &shrunk[r]));
        uint32_t rank, size;
        CHECK(ft_rank(shrunk[r], &rank, &size));
        assert(rank == r && size == RANKS - 1);
        sv[r] = (struct validation){.h = shrunk[r]};
        pthread_create(&st[r], NULL, validate_global, &sv[r]);
    }
    for (uint32_t r = 0; r < RANKS - 1; r++) {
        pthread_join(st[r], NULL);
        CHECK(sv[r].rc);
        assert(sv[r].num_failed == 0 && sv[r].num_new == 0);
        CHECK(ft_close(shrunk[r]));
    }
    printf("shrink: the %d survivors validated in a group of their own, ranks 0..%d\n",
           RANKS - 1, RANKS - 2);

    /* A broadcast rooted at rank 0 for ranks 1 and 2, in the caller's buffers: the data
     * is copied at the start (no release callback), and a destination's buffer too small
     * is FT_ERR_SIZE with the length needed. The dead rank is left out of the tree. */
    uint8_t data[1000], got[1000], tiny[10];
    for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7);
    uint32_t dests[2] = {1, 2};
    ft_bcast_output output = {.data = data, .bytes = sizeof data, .dests = dests, .ndests = 2};
    static const char header[] = "views";
    CHECK(ft_bcast_start(me, 42, (const uint8_t *)header, sizeof header, FT_TOPO_BINOMIAL, 0,
                         FT_STRATEGY_PER_CLASS, 1, &output));
    /* A destination learns of the broadcast from its events: the arrival (root, key,
     * the root's header, the outputs it needs), then each output ready. */
    for (uint32_t r = 1; r <= 2; r++) {
        ft_handle *h = ft_sim_rank(group, r);
        int fd;
        CHECK(ft_event_fd(h, &fd));
        struct pollfd pfd = {fd, POLLIN, 0};
        assert(poll(&pfd, 1, 20000) == 1 && "the arrival makes the descriptor readable");
        ev = next_event(h, FT_EVENT_ARRIVED);
        assert(ev.key == 42 && ev.root == 0 && ev.noutputs == 1 && ev.outputs[0] == 0);
        assert(ev.header_len == sizeof header && memcmp(ev.header, header, sizeof header) == 0);
        CHECK(ft_event_done(h, &ev));
        ev = next_event(h, FT_EVENT_OUTPUT_READY);
        assert(ev.key == 42 && ev.root == 0 && ev.output == 0);
        CHECK(ft_event_done(h, &ev));
        assert(!readable(fd) && "drained");
    }
    uint64_t len = 0;
    rc = ft_bcast_wait(ft_sim_rank(group, 2), 0, 42, 0, tiny, sizeof tiny, &len, 60000);
    assert(rc == FT_ERR_SIZE && len == sizeof data);
    for (uint32_t r = 1; r <= 2; r++) {
        CHECK(ft_bcast_wait(ft_sim_rank(group, r), 0, 42, 0, got, sizeof got, &len, 60000));
        assert(len == sizeof data && memcmp(got, data, sizeof data) == 0);
    }
    printf("broadcast: ranks 1 and 2 got the %u bytes\n", (unsigned)len);
    for (uint32_t r = 0; r <= 2; r++) CHECK(ft_bcast_release(ft_sim_rank(group, r), 0, 42));

    /* A lent buffer: the root's own memory, sent in place, given back through its
     * release callback exactly once, when the broadcast is released, also though a
     * destination (rank 3) dies mid-broadcast. Ranks 1 and 2 take their output without a
     * copy. */
    static uint8_t lent[200000];
    for (size_t i = 0; i < sizeof lent; i++) lent[i] = (uint8_t)(i * 13 + 5);
    uint32_t three[3] = {1, 2, 3};
    ft_bcast_output lent_output = {.data = lent, .bytes = sizeof lent, .dests = three,
                                   .ndests = 3, .release = count_release, .release_arg = lent};
    CHECK(ft_bcast_start(me, 43, NULL, 0, FT_TOPO_CHAIN, 0, FT_STRATEGY_PER_CLASS, 1,
                         &lent_output));
    CHECK(ft_sim_kill(group, 3));
    for (uint32_t r = 1; r <= 2; r++) {
        ft_buffer taken;
        CHECK(ft_bcast_take(ft_sim_rank(group, r), 0, 43, 0, &taken, 60000));
        assert(taken.len == sizeof lent && memcmp(taken.data, lent, sizeof lent) == 0);
        CHECK(ft_buffer_free(&taken));
        CHECK(ft_buffer_free(&taken)); /* a second call frees nothing twice */
    }
    assert(atomic_load(&releases) == 0 && "kept while the broadcast is");
    for (uint32_t r = 0; r <= 2; r++) CHECK(ft_bcast_release(ft_sim_rank(group, r), 0, 43));
    for (int tries = 0; atomic_load(&releases) == 0 && tries < 2000; tries++) usleep(1000);
    printf("lent buffer: released %d time(s)\n", atomic_load(&releases));

    /* Messages: rank 1 sends rank 2 a copied message and then a lent one; they arrive in
     * that order as FT_EVENT_MESSAGE, their bytes the library's buffers. A send to the
     * dead rank is refused. */
    ft_handle *one = ft_sim_rank(group, 1), *two = ft_sim_rank(group, 2);
    static const char hello[] = "hello";
    CHECK(ft_send(one, 2, 7, (const uint8_t *)hello, sizeof hello, NULL, NULL));
    CHECK(ft_send(one, 2, 8, lent, sizeof lent, NULL, NULL));
    assert(ft_send(one, VICTIM, 9, lent, 10, NULL, NULL) == FT_ERR_REFUSED);
    for (uint64_t tag = 7; tag <= 8;) {
        CHECK(ft_next_event(two, &ev, 20000));
        if (ev.kind == FT_EVENT_MESSAGE) {
            assert(ev.rank == 1 && ev.tag == tag && "in the order sent");
            const uint8_t *want = tag == 7 ? (const uint8_t *)hello : lent;
            uint64_t want_len = tag == 7 ? sizeof hello : sizeof lent;
            assert(ev.data_len == want_len && memcmp(ev.data, want, want_len) == 0);
            tag++;
        }
        CHECK(ft_event_done(two, &ev));
    }
    printf("messages: rank 2 got both, in order\n");

    /* The killed rank's handle reports the stop. */
    rc = ft_validate_local(ft_sim_rank(group, VICTIM), &num_failed, &num_new);
    assert(rc == FT_ERR_STOPPED);
    assert(ft_validate_local(NULL, &num_failed, &num_new) == FT_ERR_ARG);

    CHECK(ft_sim_close(group));
    assert(atomic_load(&releases) == 1 && "released exactly once");
    printf("sim_views: ok\n");
    return 0;
}
