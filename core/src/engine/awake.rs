//! Keeps the thread pool's workers awake for the length of one forward pass.
//!
//! A decode step is a chain of short parallel regions (a projection, attention, the FFN) with
//! short serial stretches between them (norms, RoPE, the residual). Rayon puts an idle worker to
//! sleep after a few rounds of looking for work, and waking it again costs a futex call and a
//! scheduler round trip: tens of microseconds per region, dozens of regions per token. While
//! [`with_awake_workers`] runs its closure, every other worker of the pool runs a spinner that
//! keeps looking for work with [`rayon::yield_now`], so it picks up the next region's jobs at
//! once. The spinners stop when the closure returns or panics.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread already runs a spinner (a spinner found by another's `yield_now`).
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the current rayon pool while its other workers spin instead of sleeping between
/// parallel regions. Call it from inside the pool (`pool.install`); outside a pool, in a pool of
/// one thread, or nested inside another call, it just runs `f`.
pub(super) fn with_awake_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let Some(caller) = rayon::current_thread_index() else {
        return f();
    };
    let n_threads = rayon::current_num_threads();
    if n_threads < 2 || SPINNING.get() {
        return f();
    }
    let stop = AtomicBool::new(false);
    rayon::scope(|scope| {
        for _ in 1..n_threads {
            scope.spawn(|_| spin_until(&stop, caller));
        }
        let _stop_on_exit = StopOnDrop(&stop);
        SPINNING.set(true);
        let _unmark = UnmarkOnDrop;
        f()
    })
}

/// Looks for pool work until `stop` is set. Returns at once on the thread running the closure
/// (it would never get back to setting `stop`) and on a thread that already spins.
fn spin_until(stop: &AtomicBool, caller: usize) {
    if rayon::current_thread_index() == Some(caller) || SPINNING.get() {
        return;
    }
    SPINNING.set(true);
    let _unmark = UnmarkOnDrop;
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
        } else {
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(YIELD_EVERY) {
                // more threads than cores (`-t` above the core count, other processes): let
                // the thread that has work run on this core
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Idle rounds of a spinner between two offers of its core to the OS scheduler.
const YIELD_EVERY: u32 = 16;

/// Sets the flag when dropped, so the spinners stop even if the closure panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Clears this thread's [`SPINNING`] mark when dropped.
struct UnmarkOnDrop;

impl Drop for UnmarkOnDrop {
    fn drop(&mut self) {
        SPINNING.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    #[test]
    fn runs_parallel_work_and_returns_its_result() {
        let pool = pool(3);
        let sum = pool.install(|| {
            with_awake_workers(|| {
                (0..50)
                    .map(|round| {
                        (0..10_000u64)
                            .into_par_iter()
                            .map(|i| i + round)
                            .sum::<u64>()
                    })
                    .sum::<u64>()
            })
        });
        let want: u64 = (0..50)
            .map(|round| (0..10_000u64).map(|i| i + round).sum::<u64>())
            .sum();
        assert_eq!(sum, want);
    }

    #[test]
    fn nested_and_outside_calls_just_run_the_closure() {
        assert_eq!(with_awake_workers(|| 7), 7);
        let pool = pool(2);
        let got = pool.install(|| with_awake_workers(|| with_awake_workers(|| 11)));
        assert_eq!(got, 11);
        // The pool is usable afterwards: no spinner was left running.
        assert_eq!(
            pool.install(|| (0..1000).into_par_iter().sum::<i32>()),
            499_500
        );
    }

    #[test]
    fn a_panic_stops_the_spinners_and_reaches_the_caller() {
        let pool = pool(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| with_awake_workers(|| panic!("boom")))
        }));
        assert!(caught.is_err());
        assert_eq!(
            pool.install(|| (0..1000).into_par_iter().sum::<i32>()),
            499_500
        );
    }
}
