/* fo-offload's one-pass CPU AdamW: bf16 gradients in, fp32 (p, m, v) updated in place, the new
 * weights out as bf16, all in one pass over memory (the host side's traffic is what bounds a
 * CPU-updated parameter: torch's fused AdamW wants fp32 gradients and a second pass to
 * downcast).
 *
 * Arithmetic: the same IEEE single-precision operations, in the same order, as the vectorised
 * path of torch's fused AdamW (ATen/native/cpu/FusedAdamKernel.cpp, ADAMW mode) -- built with
 * -ffp-contract=off so that only the multiply-adds that kernel fuses are fused: the lerp of m
 * always, the update of v where ``v_fma`` says (torch builds differ; the caller finds which
 * one it has by a probe). Its results are then bit-equal to torch's wherever torch takes that
 * path (all but the last numel % 16 elements of a tensor; the caller gives those to torch). The bf16 -> fp32 widening
 * is exact; fp32 -> bf16 rounds to nearest even, NaN to 0x7FC0, as c10::BFloat16 does.
 *
 * Threads: a pool of pthreads kept between calls (one call at a time; wb_adamw16 serialises
 * callers), each taking a 64-byte-aligned share of the elements; the calling thread takes the
 * first share.
 */
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 256
#define UNIT 16 /* elements per 64-byte line of fp32 */

typedef struct {
    float *p, *m, *v;
    const uint16_t *g;
    uint16_t *w; /* NULL: no bf16 copy of the new weights */
    int64_t n;
    int decay, v_fma;
    float decay_mul, lerp_coeff, lerp_small, beta2, c2, bc2_sqrt, eps, neg_step;
    int threads;
} Job;

static inline float widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Elements computed into an L1-resident buffer before their bf16 weights are streamed out. */
#define BLOCK 512

/* dst[0:n] = src[0:n] with non-temporal stores where 8-byte aligned: the weights go to memory
 * without first reading their lines (write-allocate) and without leaving dirty lines that the
 * upload's DMA read would have to snoop; measured, a plain store of them cost a quarter of the
 * update's time. */
static inline void stream_out(uint16_t *dst, const uint16_t *src, int64_t n) {
    int64_t k = 0;
#if defined(__x86_64__)
    for (; k < n && ((uintptr_t)(dst + k) & 7u); k++) dst[k] = src[k];
    for (; k + 4 <= n; k += 4) {
        long long word;
        memcpy(&word, src + k, 8);
        _mm_stream_si64((long long *)(dst + k), word);
    }
#endif
    for (; k < n; k++) dst[k] = src[k];
}

static void run_share(const Job *j, int id) {
    int64_t units = (j->n + UNIT - 1) / UNIT;
    int64_t lo = units * id / j->threads * UNIT, hi = units * (id + 1) / j->threads * UNIT;
    if (hi > j->n) hi = j->n;
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const uint16_t *restrict g = j->g;
    uint16_t *restrict w = j->w;
    const float dmul = j->decay_mul, coeff = j->lerp_coeff, b2 = j->beta2, c2 = j->c2;
    const float bc2 = j->bc2_sqrt, eps = j->eps, nstep = j->neg_step;
    const int small = j->lerp_small != 0.0f, decay = j->decay, v_fma = j->v_fma;
    uint16_t out[BLOCK] __attribute__((aligned(64)));
    for (int64_t b = lo; b < hi; b += BLOCK) {
        int64_t e = b + BLOCK < hi ? b + BLOCK : hi;
        for (int64_t i = b; i < e; i++) {
            float gi = widen(g[i]);
            float pi = p[i];
            if (decay) pi = pi * dmul;
            float mi = m[i];
            /* exp_avg.lerp_(grad, 1 - beta1), as torch's vector path: one fused multiply-add */
            mi = small ? fmaf(coeff, gi - mi, mi) : fmaf(coeff, gi - mi, gi);
            float t = c2 * gi;
            float vi = v_fma ? fmaf(t, gi, v[i] * b2) : v[i] * b2 + t * gi;
            m[i] = mi;
            v[i] = vi;
            float denom = sqrtf(vi) / bc2 + eps;
            pi = pi + (nstep * mi) / denom;
            p[i] = pi;
            out[i - b] = narrow(pi);
        }
        if (w) stream_out(w + b, out, e - b);
    }
#if defined(__x86_64__)
    if (w) _mm_sfence(); /* the streamed weights are in memory before the caller uploads them */
#endif
}

static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static Job job;
static long generation, start_gen[MAX_THREADS];
static int started, pending;

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    long seen = start_gen[id]; /* the generation before its first job */
    for (;;) {
        pthread_mutex_lock(&mu);
        while (generation == seen) pthread_cond_wait(&go, &mu);
        seen = generation;
        Job j = job;
        pthread_mutex_unlock(&mu);
        if (id < j.threads) run_share(&j, id);
        pthread_mutex_lock(&mu);
        if (--pending == 0) pthread_cond_signal(&done);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

/* A child forked after the pool started has none of its threads: it starts its own. */
static void forget_pool(void) {
    started = 0;
    pthread_mutex_init(&call_mu, NULL);
    pthread_mutex_init(&mu, NULL);
}

/* Returns 0, or -1 where a pool thread could not be started (nothing was updated). */
int wb_adamw16(float *p, float *m, float *v, const uint16_t *g, uint16_t *w, int64_t n,
               double lr, double beta1, double beta2, double eps, double weight_decay,
               double step, int threads, int v_fma) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (n < (int64_t)threads * 4096) threads = (int)(n / 4096) + 1; /* small runs: fewer */
    double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    double c1 = 1 - beta1;
    Job j = {p, m, v, g, w, n, weight_decay != 0.0, v_fma != 0, (float)(1 - lr * weight_decay),
             fabsf((float)c1) < 0.5f ? (float)c1 : (float)c1 - 1.0f,
             fabsf((float)c1) < 0.5f ? 1.0f : 0.0f, (float)beta2, (float)(1 - beta2),
             (float)sqrt(bc2), (float)eps, (float)(-(lr / bc1)), threads};
    pthread_mutex_lock(&call_mu);
    static int registered;
    if (!registered) registered = pthread_atfork(NULL, NULL, forget_pool) == 0;
    while (started < threads - 1) {
        pthread_t t;
        start_gen[started + 1] = generation; /* no job is published while call_mu is held */
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)(started + 1)) != 0) {
            pthread_mutex_unlock(&call_mu);
            return -1;
        }
        pthread_detach(t);
        started++;
    }
    pthread_mutex_lock(&mu);
    job = j;
    pending = started;
    generation++;
    pthread_cond_broadcast(&go);
    pthread_mutex_unlock(&mu);
    run_share(&j, 0);
    pthread_mutex_lock(&mu);
    while (pending > 0) pthread_cond_wait(&done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_mu);
    return 0;
}
