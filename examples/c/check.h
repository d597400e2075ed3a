/* check.h: the C examples' error handling: CHECK(call) prints the failing call with
 * ft_strerror of its code and exits 1. */
#ifndef FT_EXAMPLES_CHECK_H
#define FT_EXAMPLES_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "ft.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        int rc_ = (call);                                                        \
        if (rc_ != FT_SUCCESS) {                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    ft_strerror(rc_));                                           \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#endif
