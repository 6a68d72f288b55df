/*
 * rng.c — the splitmix64 generator every seeded thing in the model uses:
 * initial weights (layout.c), batches (data.c, task.c) and sampling
 * (sample.c).
 *
 * Randomness is a value (dt_rng, 8 bytes) the caller owns, never a global:
 * the same seed gives the same weights, batches and samples on every
 * machine and in every thread. It lives in a file of its own, below
 * everything that draws from it, so initialisation and the data sets do
 * not depend on the file that runs the model.
 *
 * Cost: a few multiplies and shifts per draw. No state but the caller's.
 */
#include "dt_model.h"

void dt_rng_seed(dt_rng *r, uint64_t seed)
{
    r->state = seed;
}

/* splitmix64: a 64-bit counter passed through a strong mixer. */
uint64_t dt_rng_next(dt_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64's state is a counter: k draws add k times the increment. */
void dt_rng_skip(dt_rng *r, uint64_t draws)
{
    r->state += draws * 0x9E3779B97F4A7C15ull;
}

float dt_rng_uniform(dt_rng *r)
{
    return (float)(dt_rng_next(r) >> 40) * (1.0f / 16777216.0f); /* 24 bits */
}
