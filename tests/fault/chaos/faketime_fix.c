/* Preloaded before Debian's libfaketime (0.9.10) in a chaos worker whose wall clock is skewed
 * (clock.py). With FAKETIME_DONT_FAKE_MONOTONIC=1 that libfaketime gets two waits wrong:
 *
 * - clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) gets a negative deadline and fails with
 *   EINVAL: Python 3.11's time.sleep() raises. The monotonic clock is not faked, so the call
 *   goes to the kernel as it is.
 * - cnd_timedwait() (C11, which librdkafka waits with) is not intercepted: its deadline, read
 *   from the skewed wall clock, is waited for on the real one, so every wait of librdkafka's
 *   threads ends the skew too late (clock ahead: a stall) or at once (behind: a busy loop).
 *   It is passed to pthread_cond_timedwait(), which libfaketime translates to the real clock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request,
                    struct timespec *remain) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock_id == CLOCK_MONOTONIC) {
        return syscall(SYS_clock_nanosleep, clock_id, flags, request, remain) == 0 ? 0 : errno;
    }
    if (next == NULL) {
        next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))
            dlsym(RTLD_NEXT, "clock_nanosleep");
    }
    return next(clock_id, flags, request, remain);
}

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex,
                  const struct timespec *restrict deadline) {
    int err = pthread_cond_timedwait((pthread_cond_t *)cond, (pthread_mutex_t *)mutex, deadline);
    return err == 0 ? thrd_success : err == ETIMEDOUT ? thrd_timedout : thrd_error;
}
