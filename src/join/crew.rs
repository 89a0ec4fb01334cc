//! The threads that build the similarity join: the tasks that read its inputs.
//!
//! The build needs every input read, so it used to start after the read tasks had finished,
//! on a thread pool that had slept through the read. On a virtual machine a parked thread takes
//! 0.1 ms or more to wake (and may be woken onto the waker's CPU), and each of the build's
//! parallel steps paid that: on two cores the build took as long as on one. Here the read tasks
//! do it themselves, with no thread woken. The last task to finish its read builds (the
//! *leader*, with every result at hand); a task that finished earlier stays on its thread and
//! *helps*: it takes pieces of each parallel step the leader publishes ([`Crew::for_each`])
//! until the build is done.
//!
//! A helper never waits for what its own thread must run:
//! - it spins for the other readers only while every one of them is inside a poll (running on
//!   another thread right now), and for the build only once the leader runs it (inside one
//!   poll of the leader's task);
//! - after [`IDLE_SPIN`] with nothing to do it stops spinning and waits for a waker (the next
//!   step, or the end of the build).
//!
//! The leader waits only for pieces that a helper has taken and is running. Every result is the
//! same whoever runs which piece: the steps' pieces are fixed by the leader, not by the number
//! of helpers.

use std::future::{Future, poll_fn};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use datafusion::common::{Result, internal_err};

/// How long a helper spins with nothing to do before it waits for a waker.
const IDLE_SPIN: Duration = Duration::from_millis(20);

/// One piece of work of the step being run: `job(i)`, lifetime erased (see [`Crew::for_each`]).
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the closure behind the pointer is `Sync`, and the leader keeps it alive until no
// helper runs it any more (`Step::running` back to 0 with no piece left to take).
unsafe impl Send for Job {}

/// The step being run, if any.
#[derive(Default)]
struct Step {
    job: Option<Job>,
    /// Pieces of the step, and the next one to take.
    pieces: usize,
    next: usize,
    /// Pieces taken by helpers and not finished.
    running: usize,
    /// A helper's piece panicked.
    panicked: bool,
}

/// The readers of a join's inputs, and the build they run together.
pub(crate) struct Crew {
    /// Reading tasks in all.
    readers: usize,
    /// Readers that have not finished reading.
    unfinished: AtomicUsize,
    /// Of those, the ones inside a poll right now.
    polling: AtomicUsize,
    /// The leader runs the build.
    building: AtomicBool,
    /// The build is over: helpers leave.
    done: AtomicBool,
    /// A step has pieces to take (a hint for spinning helpers, checked under `step`).
    open: AtomicBool,
    step: Mutex<Step>,
    /// Helpers waiting for the next step or the end.
    waiting: Mutex<Vec<Waker>>,
}

/// `m` locked; a lock poisoned by a panic is taken anyway (the panic itself is reported).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Crew {
    /// A crew of `readers` reading tasks.
    pub(crate) fn new(readers: usize) -> Self {
        Self {
            readers,
            unfinished: AtomicUsize::new(readers),
            polling: AtomicUsize::new(0),
            building: AtomicBool::new(false),
            done: AtomicBool::new(false),
            open: AtomicBool::new(false),
            step: Mutex::new(Step::default()),
            waiting: Mutex::new(Vec::new()),
        }
    }

    /// `read`, counted as one reader's read: while it is polled, the others know it runs.
    /// Its output goes to `keep`; then returns whether this reader was the last to finish,
    /// which leads the build. The output is kept before the reader counts as finished (so the
    /// last one finds every output), and the build is marked as running before the last
    /// reader stops counting as polled (so a helper never sees a moment with neither).
    pub(crate) async fn read<F: Future>(&self, read: F, keep: impl FnOnce(F::Output)) -> bool {
        let mut read = std::pin::pin!(read);
        let mut keep = Some(keep);
        poll_fn(|cx| {
            self.polling.fetch_add(1, Ordering::AcqRel);
            let r = read.as_mut().poll(cx).map(|out| {
                if let Some(keep) = keep.take() {
                    keep(out);
                }
                let last = self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1;
                if last {
                    self.building.store(true, Ordering::Release);
                }
                last
            });
            self.polling.fetch_sub(1, Ordering::AcqRel);
            r
        })
        .await
    }

    /// The leader's build is over (or failed): helpers return.
    pub(crate) fn finish_build(&self) {
        self.done.store(true, Ordering::Release);
        self.wake_all();
    }

    fn wake_all(&self) {
        let waiting = std::mem::take(&mut *lock(&self.waiting));
        for w in waiting {
            w.wake();
        }
    }

    /// Whether a helper may spin: the thread it would hold up is not one anything waits for.
    fn may_spin(&self) -> bool {
        if self.building.load(Ordering::Acquire) {
            return true;
        }
        let unfinished = self.unfinished.load(Ordering::Acquire);
        // The last reader marks the build before it stops counting as polled: seeing it
        // gone from `polling`, this sees `building`.
        (unfinished > 0 && self.polling.load(Ordering::Acquire) >= unfinished)
            || self.building.load(Ordering::Acquire)
    }

    /// Takes a piece of the open step and runs it; `false` when there was none.
    fn run_one(&self) -> bool {
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let (job, i) = {
            let mut s = lock(&self.step);
            match s.job {
                Some(job) if s.next < s.pieces => {
                    let i = s.next;
                    s.next += 1;
                    s.running += 1;
                    (job, i)
                }
                _ => return false,
            }
        };
        /// Marks the piece finished, even if it panics.
        struct Finished<'a>(&'a Crew);
        impl Drop for Finished<'_> {
            fn drop(&mut self) {
                let mut s = lock(&self.0.step);
                s.running -= 1;
                s.panicked |= std::thread::panicking();
            }
        }
        let _finished = Finished(self);
        // SAFETY: the leader keeps the closure alive while `running` > 0 (`for_each`).
        unsafe { (*job.0)(i) };
        true
    }

    /// A reader done reading and not the leader: help with the build's steps until it is
    /// over (or until nothing is left to do for [`IDLE_SPIN`]; then wait to be woken).
    pub(crate) async fn help(&self) {
        poll_fn(|cx| {
            let mut idle = Instant::now();
            loop {
                if self.done.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                if self.run_one() {
                    idle = Instant::now();
                    continue;
                }
                if !self.may_spin() || idle.elapsed() > IDLE_SPIN {
                    lock(&self.waiting).push(cx.waker().clone());
                    // Anything that changed before the waker was in place is seen here.
                    if self.done.load(Ordering::Acquire) || self.open.load(Ordering::Acquire) {
                        idle = Instant::now();
                        continue;
                    }
                    return Poll::Pending;
                }
                std::hint::spin_loop();
            }
        })
        .await
    }

    /// Helps until the build is over, on a thread of its own (tests).
    #[cfg(test)]
    pub(crate) fn help_blocking(&self) {
        while !self.done.load(Ordering::Acquire) {
            if !self.run_one() {
                std::hint::spin_loop();
            }
        }
    }

    /// `lead(crew)` on this thread as the leader of a crew of `threads`, the others helping on
    /// threads of their own until it returns (tests).
    #[cfg(test)]
    pub(crate) fn led<T>(threads: usize, lead: impl FnOnce(&Crew) -> T) -> T {
        let crew = Crew::new(threads);
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(|| crew.help_blocking());
            }
            let out = lead(&crew);
            crew.finish_build();
            out
        })
    }

    /// `f(i)` for every `i` in `0..pieces`, by the leader and whichever helpers are there;
    /// returns when all are done. An error if a helper's piece panicked.
    pub(crate) fn for_each(&self, pieces: usize, f: impl Fn(usize) + Sync) -> Result<()> {
        if pieces <= 1 || !self.helpers_possible() {
            (0..pieces).for_each(f);
            return Ok(());
        }
        let f: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: only the lifetime changes. The pointer is dropped from the step before this
        // function returns or unwinds (`Close`), and helpers hold it only while `running` counts
        // them, which `Close` waits out.
        let job = Job(unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f)
        });
        {
            let mut s = lock(&self.step);
            *s = Step {
                job: Some(job),
                pieces,
                next: 0,
                running: 0,
                panicked: false,
            };
        }
        self.open.store(true, Ordering::Release);
        self.wake_all();
        /// Closes the step once no helper runs a piece of it: on return and on unwind.
        struct Close<'a>(&'a Crew);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                self.0.open.store(false, Ordering::Release);
                loop {
                    {
                        let mut s = lock(&self.0.step);
                        s.next = s.pieces;
                        if s.running == 0 {
                            s.job = None;
                            return;
                        }
                    }
                    std::hint::spin_loop();
                }
            }
        }
        let close = Close(self);
        loop {
            let i = {
                let mut s = lock(&self.step);
                if s.next >= s.pieces {
                    break;
                }
                s.next += 1;
                s.next - 1
            };
            f(i);
        }
        drop(close);
        if std::mem::take(&mut lock(&self.step).panicked) {
            return internal_err!("SimilarityJoinExec: a piece of the build panicked on a helper");
        }
        Ok(())
    }

    /// `f(i)` for `i` in `0..pieces` as [`Self::for_each`], the results in order.
    pub(crate) fn map<T: Send>(
        &self,
        pieces: usize,
        f: impl Fn(usize) -> T + Sync,
    ) -> Result<Vec<T>> {
        let out: Vec<Mutex<Option<T>>> = (0..pieces).map(|_| Mutex::new(None)).collect();
        self.for_each(pieces, |i| *lock(&out[i]) = Some(f(i)))?;
        out.into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .map(|v| match v {
                Some(v) => Ok(v),
                None => internal_err!("SimilarityJoinExec: a piece of the build left no result"),
            })
            .collect()
    }

    /// Whether anyone but the leader can take pieces: a crew of more than one reader.
    fn helpers_possible(&self) -> bool {
        self.readers > 1
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        self.finish_build();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// `f` on a thread of its own; a failure if it panics or takes more than a minute (a hang
    /// fails the test instead of stalling the run).
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(v) => v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for a minute"),
            Err(e) => panic!("panicked: {e}"),
        }
    }

    /// Busy for about `us` microseconds.
    fn busy(us: u64) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_micros(us) {
            std::hint::spin_loop();
        }
    }

    /// Waits up to 10 s for `cond`.
    fn wait_for(cond: impl Fn() -> bool) -> bool {
        let t0 = Instant::now();
        while !cond() {
            if t0.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    #[test]
    fn every_piece_runs_once_whoever_takes_it() {
        within_a_minute(|| {
            for helpers in [0usize, 1, 3] {
                let leader = std::thread::current().id();
                let helped = AtomicUsize::new(0);
                Crew::led(helpers + 1, |crew| {
                    for step in 0..40usize {
                        let pieces = step * 7 % 23;
                        let runs: Vec<AtomicUsize> =
                            (0..pieces).map(|_| AtomicUsize::new(0)).collect();
                        let squares = crew
                            .map(pieces, |i| {
                                runs[i].fetch_add(1, Ordering::Relaxed);
                                if std::thread::current().id() != leader {
                                    helped.fetch_add(1, Ordering::Relaxed);
                                } else if helpers > 0 && step == 3 {
                                    // The leader holds its piece until a helper has run one.
                                    assert!(wait_for(|| helped.load(Ordering::Relaxed) > 0));
                                }
                                busy(20);
                                i * i
                            })
                            .unwrap();
                        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
                        assert_eq!(squares, (0..pieces).map(|i| i * i).collect::<Vec<_>>());
                    }
                });
                assert_eq!(helped.load(Ordering::Relaxed) > 0, helpers > 0);
            }
        });
    }

    #[test]
    fn a_panic_on_a_helper_is_an_error_for_the_leader() {
        let message = within_a_minute(|| {
            let crew = Crew::new(2);
            let leader = std::thread::current().id();
            let failed = AtomicBool::new(false);
            std::thread::scope(|s| {
                let helper = s.spawn(|| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crew.help_blocking()))
                        .is_err()
                });
                let out = crew.for_each(4, |_| {
                    if std::thread::current().id() == leader {
                        assert!(wait_for(|| failed.load(Ordering::Relaxed)));
                    } else {
                        failed.store(true, Ordering::Relaxed);
                        panic!("a piece fails");
                    }
                });
                crew.finish_build();
                assert!(helper.join().unwrap(), "the helper's panic reached it");
                out.unwrap_err().to_string()
            })
        });
        assert!(message.contains("panicked on a helper"), "{message}");
    }

    /// Readers through [`Crew::read`] on a runtime: the last leads a build of several steps,
    /// the others help; every task ends, each piece runs once.
    fn readers_build(runtime: tokio::runtime::Runtime, readers: usize) -> usize {
        let crew = Arc::new(Crew::new(readers));
        let outputs = Arc::new(Mutex::new(Vec::new()));
        let pieces_run = Arc::new(AtomicUsize::new(0));
        runtime.block_on(async {
            let tasks: Vec<_> = (0..readers)
                .map(|r| {
                    let (crew, outputs, pieces_run) = (
                        Arc::clone(&crew),
                        Arc::clone(&outputs),
                        Arc::clone(&pieces_run),
                    );
                    tokio::spawn(async move {
                        let read = async move {
                            // Reads of different lengths, each yielding now and then.
                            for _ in 0..(r * 3 % 7) {
                                tokio::task::yield_now().await;
                                busy(100);
                            }
                            r
                        };
                        if crew.read(read, |out| lock(&outputs).push(out)).await {
                            assert_eq!(lock(&outputs).len(), readers, "every output is in");
                            for _ in 0..5 {
                                let got = crew
                                    .map(32, |i| {
                                        pieces_run.fetch_add(1, Ordering::Relaxed);
                                        busy(30);
                                        i
                                    })
                                    .unwrap();
                                assert_eq!(got, (0..32).collect::<Vec<_>>());
                            }
                            crew.finish_build();
                        } else {
                            crew.help().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        let mut outputs = lock(&outputs).clone();
        outputs.sort_unstable();
        assert_eq!(outputs, (0..readers).collect::<Vec<_>>());
        pieces_run.load(Ordering::Relaxed)
    }

    #[test]
    fn readers_build_together_on_any_runtime() {
        for readers in [1, 2, 5] {
            let runs = within_a_minute(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .build()
                    .unwrap();
                readers_build(rt, readers)
            });
            assert_eq!(runs, 5 * 32);
            // One thread for every reader: a helper must not spin while the reader it would
            // wait for is queued behind it.
            let runs = within_a_minute(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                readers_build(rt, readers)
            });
            assert_eq!(runs, 5 * 32);
        }
    }
}
