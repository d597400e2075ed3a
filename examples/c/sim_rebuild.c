/* sim_rebuild.c: rebuilding a group simulated in this process from spares, from C.
 *
 * Six ranks split two off as spares (ft_split_spares, collective: one thread per rank):
 * ranks 0..3 get handles on the working team, ranks 4 and 5 none and wait on their own
 * handles. Team rank 1 is killed; the survivors agree on G = [1] and rebuild
 * (ft_rebuild): their new handles' first event tells them rank 1 was replaced, in its
 * second incarnation (generation 1), and spare 4 learns of its admission on the handle
 * it waited on (FT_EVENT_ADMITTED) and takes its new handle (ft_admitted). The rebuilt
 * group keeps its size and numbering and validates on its own, G empty; rank 1's
 * generation is 1 there. Then two more team ranks die at once: with one spare left, a
 * rebuild is refused with FT_ERR_NO_SPARES. Handles close derived first. Asserts on
 * every result.
 *
 * Build and run (from the repository root, after `cargo build --release -p ft-capi`):
 *   cc -Wall -Wextra -O2 examples/c/sim_rebuild.c -Ift-capi/include \
 *      -Ltarget/release -lft -Wl,-rpath,$PWD/target/release -lpthread -o sim_rebuild
 *   ./sim_rebuild
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ft.h"
#include "check.h"
#include "validation.h"

#define RANKS 6
#define SPARES 2
#define TEAM (RANKS - SPARES)
#define VICTIM 1

struct split {
    ft_handle *h, *team;
    int rc;
};

static void *split_spares(void *arg) {
    struct split *s = arg;
    s->rc = ft_split_spares(s->h, SPARES, &s->team);
    return NULL;
}

/* Runs ft_validate_global on the n handles, each on its own thread (it is collective),
 * until they agree on a G of `want` ranks (bounded); checks they all agreed. */
static void validate_until(ft_handle *const *handles, uint32_t n, uint32_t want) {
    for (int tries = 0;; tries++) {
        assert(tries < 400 && "G never reached the expected size");
        pthread_t threads[RANKS];
        struct validation v[RANKS];
        for (uint32_t k = 0; k < n; k++) {
            v[k] = (struct validation){.h = handles[k]};
            pthread_create(&threads[k], NULL, validate_global, &v[k]);
        }
        for (uint32_t k = 0; k < n; k++) {
            pthread_join(threads[k], NULL);
            CHECK(v[k].rc);
            assert(v[k].num_failed == v[0].num_failed && "G is uniform");
        }
        if (v[0].num_failed == want) return;
        usleep(50000);
    }
}

/* The next event of `h` of kind `kind` (waiting at most 20 s for each), skipping the
 * others. Hand it to ft_event_done once read. */
static ft_event next_of_kind(ft_handle *h, uint32_t kind) {
    for (;;) {
        ft_event ev;
        CHECK(ft_next_event(h, &ev, 20000));
        if (ev.kind == kind) return ev;
        CHECK(ft_event_done(h, &ev));
    }
}

int main(void) {
    ft_sim *group;
    CHECK(ft_sim_open(RANKS, 20, 300, &group));
    ft_handle *base[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        base[r] = ft_sim_rank(group, r);
        assert(base[r] != NULL);
    }

    /* The split is collective: every rank calls it, on its own thread. */
    pthread_t threads[RANKS];
    struct split s[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        s[r] = (struct split){.h = base[r]};
        pthread_create(&threads[r], NULL, split_spares, &s[r]);
    }
    ft_handle *team[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        pthread_join(threads[r], NULL);
        CHECK(s[r].rc);
        team[r] = s[r].team;
        assert((r < TEAM) == (team[r] != NULL) && "ranks 4 and 5 are spares");
        if (team[r] != NULL) {
            uint32_t rank, size;
            CHECK(ft_rank(team[r], &rank, &size));
            assert(rank == r && size == TEAM);
        }
    }
    printf("split_spares: team of ranks 0..%d, spares %d and %d\n", TEAM - 1, TEAM,
           TEAM + 1);

    /* Rank 1 dies; the survivors agree on G = [1] on their team handles. */
    CHECK(ft_sim_kill(group, VICTIM));
    ft_handle *survivors[TEAM - 1] = {team[0], team[2], team[3]};
    validate_until(survivors, TEAM - 1, 1);
    printf("validate_global: the %d survivors agreed on G = [%d]\n", TEAM - 1, VICTIM);

    /* Each survivor rebuilds: the new handle's first event names the rank replaced. */
    ft_handle *rebuilt[TEAM - 1];
    for (uint32_t k = 0; k < TEAM - 1; k++) {
        CHECK(ft_rebuild(survivors[k], &rebuilt[k]));
        ft_event ev;
        CHECK(ft_next_event(rebuilt[k], &ev, 20000));
        assert(ev.kind == FT_EVENT_REPLACED && "the rebuilt handle's first event");
        assert(ev.rank == VICTIM && ev.generation == 1 && ev.group == 0);
        CHECK(ft_event_done(rebuilt[k], &ev));
        uint32_t rank, size, old_rank;
        CHECK(ft_rank(rebuilt[k], &rank, &size));
        CHECK(ft_rank(survivors[k], &old_rank, &size));
        assert(rank == old_rank && size == TEAM && "the same size and numbering");
    }
    printf("rebuild: rank %d replaced, generation 1\n", VICTIM);

    /* Spare 4 learns of its admission on the handle it waited on, and takes its handle
     * on the rebuilt group (once: a second take finds nothing). */
    ft_event ev = next_of_kind(base[TEAM], FT_EVENT_ADMITTED);
    assert(ev.rank == VICTIM && ev.generation == 1);
    uint32_t admitted_group = ev.group;
    CHECK(ft_event_done(base[TEAM], &ev));
    ft_handle *spare = NULL, *again = (ft_handle *)1;
    CHECK(ft_admitted(base[TEAM], admitted_group, &spare));
    assert(spare != NULL);
    CHECK(ft_admitted(base[TEAM], admitted_group, &again));
    assert(again == NULL && "taken once");
    CHECK(ft_next_event(spare, &ev, 20000));
    assert(ev.kind == FT_EVENT_ADMITTED && ev.rank == VICTIM && ev.generation == 1 &&
           ev.group == admitted_group);
    CHECK(ft_event_done(spare, &ev));
    uint32_t rank, size;
    CHECK(ft_rank(spare, &rank, &size));
    assert(rank == VICTIM && size == TEAM);
    printf("admitted: spare %d is rank %u of group %u, generation 1\n", TEAM, rank,
           admitted_group);

    /* The rebuilt group validates on its own, G empty; rank 1 is in its second
     * incarnation in every member's view. */
    ft_handle *members[TEAM] = {rebuilt[0], spare, rebuilt[1], rebuilt[2]};
    validate_until(members, TEAM, 0);
    for (uint32_t k = 0; k < TEAM; k++) {
        ft_rank_info info;
        uint32_t modifier;
        CHECK(ft_get_rank_info(members[k], FT_SCOPE_GLOBAL, VICTIM, &info, &modifier));
        assert(info.rank == VICTIM && info.state == FT_STATE_OK && info.generation == 1);
        CHECK(ft_rank(members[k], &rank, &size));
        assert(rank == k && size == TEAM);
    }
    printf("rebuilt group: %d members validated, G = [], rank %d at generation 1\n", TEAM,
           VICTIM);

    /* Ranks 2 and 3 die at once: one spare is left for two numbers, so a rebuild is
     * refused, and nothing changes. */
    CHECK(ft_sim_kill(group, 2));
    CHECK(ft_sim_kill(group, 3));
    ft_handle *left[2] = {rebuilt[0], spare};
    validate_until(left, 2, 2);
    ft_handle *none = NULL;
    int rc = ft_rebuild(rebuilt[0], &none);
    printf("rebuild after 2 more deaths: %s\n", ft_strerror(rc));
    assert(rc == FT_ERR_NO_SPARES && none == NULL);
    assert(strcmp(ft_strerror(FT_ERR_NO_SPARES), "unknown error code") != 0);

    /* Derived handles close before the handles they came from; the base handles belong
     * to the group (ft_sim_close). */
    CHECK(ft_close(spare));
    for (uint32_t k = 0; k < TEAM - 1; k++) CHECK(ft_close(rebuilt[k]));
    for (uint32_t r = 0; r < TEAM; r++) CHECK(ft_close(team[r]));
    CHECK(ft_sim_close(group));
    printf("sim_rebuild: ok\n");
    return 0;
}
