/* The native step's crew: the engine's extra threads for the products and attention of one pass.
 *
 * Why: a decode step of a model whose weights do not fit in cache reads every weight once, and one
 * core cannot pull memory as fast as the bus delivers it; a second core streaming its own half of
 * each weight matrix nearly doubles what is read per second. The products are ~95% of such a
 * step and most of a prompt's, and attention most of the rest, so those two are shared: each
 * product's output columns (float32) or weight rows (int8), and the pass's attention units (a row
 * or prompt chunk against one KV head), are cut into equal runs, one per thread, and the calling
 * thread takes the first run itself. Every output element is still computed by one thread in the
 * same order, so the result is the same bits with any number of threads.
 *
 * How the threads wait: between passes they sleep on a condition variable, so an idle engine
 * costs nothing beside a browser. During a pass they spin (with `pause`) for the next product,
 * which comes within microseconds: waking a sleeping thread for each of a step's ~200 products
 * would cost more than the products gain. `crew_begin` wakes them at the start of a pass and
 * `crew_end` lets them sleep again.
 *
 * One crew per process. A pass that finds it busy (two engines stepping at once from two Python
 * threads) runs on its own thread alone.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define CREW_MAX 64

typedef void (*crew_fn)(const void *job, int t, int T); /* do share t of T */

typedef struct {
    pthread_mutex_t busy; /* held by the pass that owns the crew */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int hired;               /* worker threads started (they never exit) */
    unsigned hired_at[CREW_MAX]; /* gen when worker t was started */
    _Atomic int active;      /* 1 during a pass: workers spin instead of sleeping */
    _Atomic unsigned gen;    /* bumped for each product */
    _Atomic int done;        /* workers finished with this product */
    int T;                   /* threads sharing this product, the caller included */
    crew_fn fn;
    const void *job;
} Crew;

static Crew crew = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

/* One spin of a wait. A wait that lasts SPIN_YIELD spins (~0.2 ms here) is not a product's few microseconds:
 * the thread waited on is off its core (more threads than cores: a browser, a second test process),
 * so each later spin gives the core away instead of holding it from that thread. */
#ifndef SPIN_YIELD
#define SPIN_YIELD (1 << 13)
#endif
static inline void crew_pause(unsigned *spins) {
    if (++*spins < SPIN_YIELD)
        cpu_relax(); /* native_vec.h: x86 `pause`, ARM `yield` */
    else
        sched_yield();
}

static void *crew_worker(void *arg) {
    const int t = (int)(long)arg;
    unsigned seen = crew.hired_at[t]; /* the products before this thread was hired are not its */
    for (;;) {
        unsigned spins = 0;
        while (atomic_load_explicit(&crew.gen, memory_order_acquire) == seen) {
            if (atomic_load_explicit(&crew.active, memory_order_relaxed)) {
                crew_pause(&spins);
                continue;
            }
            pthread_mutex_lock(&crew.mu);
            while (atomic_load(&crew.gen) == seen && !atomic_load(&crew.active)) pthread_cond_wait(&crew.wake, &crew.mu);
            pthread_mutex_unlock(&crew.mu);
        }
        seen = atomic_load_explicit(&crew.gen, memory_order_acquire);
        if (t < crew.T) {
            crew.fn(crew.job, t, crew.T);
            atomic_fetch_add_explicit(&crew.done, 1, memory_order_release);
        }
    }
    return 0;
}

/* A forked child has none of the parent's workers: it starts with an empty crew. */
static void crew_after_fork(void) {
    pthread_mutex_init(&crew.busy, 0), pthread_mutex_init(&crew.mu, 0), pthread_cond_init(&crew.wake, 0);
    crew.hired = 0, atomic_store(&crew.active, 0);
}
static pthread_once_t crew_once = PTHREAD_ONCE_INIT;
static void crew_register(void) { pthread_atfork(0, 0, crew_after_fork); }

/* Take the crew for a pass of T threads; returns the threads this pass really has (1 if busy). */
static int crew_begin(int T) {
    if (T <= 1) return 1;
    pthread_once(&crew_once, crew_register);
    if (pthread_mutex_trylock(&crew.busy) != 0) return 1;
    T = T > CREW_MAX ? CREW_MAX : T;
    pthread_mutex_lock(&crew.mu);
    while (crew.hired < T - 1) {
        pthread_t th;
        crew.hired_at[crew.hired + 1] = atomic_load(&crew.gen);
        if (pthread_create(&th, 0, crew_worker, (void *)(long)(crew.hired + 1)) != 0) break;
        pthread_detach(th);
        crew.hired++;
    }
    T = T < crew.hired + 1 ? T : crew.hired + 1;
    if (T <= 1) { /* no worker could be started: the pass runs alone and the crew stays free */
        pthread_mutex_unlock(&crew.mu);
        pthread_mutex_unlock(&crew.busy);
        return 1;
    }
    atomic_store(&crew.active, 1);
    pthread_cond_broadcast(&crew.wake);
    pthread_mutex_unlock(&crew.mu);
    return T;
}

static void crew_end(int T) {
    if (T <= 1) return;
    atomic_store(&crew.active, 0);
    pthread_mutex_unlock(&crew.busy);
}

/* Run fn's T shares: workers 1..T-1 and the caller as share 0; returns when all are done. */
static void crew_run(int T, crew_fn fn, const void *job) {
    if (T <= 1) {
        fn(job, 0, 1);
        return;
    }
    crew.T = T, crew.fn = fn, crew.job = job;
    atomic_store_explicit(&crew.done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&crew.gen, 1, memory_order_release);
    fn(job, 0, T);
    unsigned spins = 0;
    while (atomic_load_explicit(&crew.done, memory_order_acquire) < T - 1) crew_pause(&spins);
}

/* Share t of T of `units` equal pieces: [*a, *b). */
static inline void crew_share(int units, int t, int T, int *a, int *b) {
    *a = (int)((long)units * t / T), *b = (int)((long)units * (t + 1) / T);
}
