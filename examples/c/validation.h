/* validation.h: ft_validate_global on a thread of its own, for the simulated examples,
 * whose ranks share one process: the call is collective, so every rank of the group
 * runs it at once, one thread each (pthread_create(&t, NULL, validate_global, &v)). */
#ifndef FT_EXAMPLES_VALIDATION_H
#define FT_EXAMPLES_VALIDATION_H

#include <stdint.h>

#include "ft.h"

/* One rank's call: its handle in, the call's results out. */
struct validation {
    ft_handle *h;
    uint32_t num_failed, num_new;
    int rc;
};

static inline void *validate_global(void *arg) {
    struct validation *v = arg;
    v->rc = ft_validate_global(v->h, &v->num_failed, &v->num_new);
    return NULL;
}

#endif
