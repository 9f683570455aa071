//! Graceful stop: what a `flashsale serve` process does between SIGTERM
//! (or SIGINT) and its exit, and the parts of the shop that must finish
//! before it exits.
//!
//! The order, driven by `startup::Application::run_until_signalled`:
//! 1. `/readyz` answers 503 "draining" at once (`Stopping::start_draining`),
//!    so a load balancer polling it takes the instance out of rotation;
//!    every answer from then on says `Connection: close`, so kept-alive
//!    clients reconnect, to another instance.
//! 2. For `DRAIN_SECONDS` the instance goes on serving whatever still
//!    arrives: the balancer needs a poll or two to notice.
//! 3. The background jobs are told to stop: each finishes the run it is
//!    in and starts no other. The instance stops accepting connections,
//!    refuses (503, nothing started) any request that still arrives on a
//!    connection already open, and waits for every tracked task (below)
//!    to end, then for actix to finish the requests still open.
//! 4. It waits for the jobs' last runs and the tasks they started; then
//!    the process exits 0 (`std::process::exit`, not the runtime's drop,
//!    which would wait without a bound for a blocking call still running).
//!
//! Steps 3 and 4 share one deadline, `SHUTDOWN_TIMEOUT_SECS` from the end
//! of the drain (`Stopping::start_deadline`): each wait gets what the ones
//! before it left. A wait still going at the deadline is cut and logged,
//! the waits after it only collect what already ended, and the process
//! exits 0; so a stop takes at most `DRAIN_SECONDS` +
//! `SHUTDOWN_TIMEOUT_SECS`, however many steps are held up.
//!
//! A second SIGTERM or SIGINT during any of it ends the process at once
//! (status 143): the operator has chosen not to wait.
//!
//! Why tracked tasks: actix runs each worker on its own runtime and drops
//! that runtime, with every task spawned on it, once the worker's last
//! connection has closed. A purchase runs on a task of its own so that a
//! buyer who hangs up cannot cancel it half way; a lock is released, a
//! declined order restored, a batch of gate admissions sent, a waiting
//! room's joins written, all on tasks nobody's request awaits to the end.
//! Dropping one of those mid-way is survivable (reconcile, the pending
//! admissions' TTL, lock leases and idempotency keys recover what a
//! `kill -9` leaves), but slow and needless on a planned stop. So such
//! tasks are spawned with [`spawn`], which counts them process-wide, and
//! the stop waits for the count to reach zero before the workers go.
//! (Batch leaders, committers and join writers run on `serial`'s runtime,
//! which no worker's end drops; they are counted and waited for all the
//! same, since the process exits once the stop is over.)
//! The count is process-wide rather than per shop because the runtime that
//! would drop them is the process's; a test serving two shops in one
//! process only waits a little longer.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Whether the process is stopping, shared by `/readyz` (draining) and the
/// background jobs (told to stop at their next loop boundary).
#[derive(Clone)]
pub struct Stopping {
    draining: Arc<AtomicBool>,
    /// Set once the drain is over: a request that still arrives (on a
    /// kept-alive connection, or one accepted just before the listener
    /// paused) is refused before it starts anything, because work it would
    /// hand to a task after the tracked-task wait could be dropped with its
    /// worker. Nothing was done, so a 503 is the truth.
    refusing: Arc<AtomicBool>,
    jobs: Arc<watch::Sender<bool>>,
    /// When everything after the drain must be over, set once when the
    /// drain ends (`start_deadline`): every later wait of the stop uses
    /// what is left of it.
    deadline: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for Stopping {
    fn default() -> Self {
        Stopping::new()
    }
}

impl Stopping {
    pub fn new() -> Stopping {
        Stopping {
            draining: Arc::new(AtomicBool::new(false)),
            refusing: Arc::new(AtomicBool::new(false)),
            jobs: Arc::new(watch::channel(false).0),
            deadline: Arc::new(watch::channel(None).0),
        }
    }

    /// From now on `/readyz` answers 503 and answers close their connection.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The drain is over: requests from now on are refused unstarted.
    pub fn refuse_new_requests(&self) {
        self.refusing.store(true, Ordering::SeqCst);
    }

    pub fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::SeqCst)
    }

    /// The stop's one deadline, `timeout` from now unless it was started
    /// already (then the one started first).
    pub fn start_deadline(&self, timeout: Duration) -> Instant {
        let mut deadline = Instant::now() + timeout;
        self.deadline.send_if_modified(|set| match set {
            Some(started) => {
                deadline = *started;
                false
            }
            None => {
                *set = Some(deadline);
                true
            }
        });
        deadline
    }

    /// Resolves once the stop's deadline has been started and has passed.
    pub async fn deadline_passed(&self) {
        let mut started = self.deadline.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let Ok(deadline) = started.wait_for(Option::is_some).await.map(|set| *set) else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(deadline.expect("waited for it")).await;
    }

    /// Tells every job holding a `StopSignal` to stop after its current run.
    pub fn stop_jobs(&self) {
        self.jobs.send_replace(true);
    }

    pub fn signal(&self) -> StopSignal {
        StopSignal(self.jobs.subscribe())
    }
}

/// A background job's view of `Stopping::stop_jobs`. A job waits on
/// `stopped()` only where it would otherwise wait for its next tick, never
/// around a run, so a run is never cut short.
#[derive(Clone)]
pub struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    /// A signal that never fires, for callers with no stop to wait for.
    pub fn never() -> StopSignal {
        let (sender, receiver) = watch::channel(false);
        // Kept alive forever: a dropped sender would read as "stop".
        std::mem::forget(sender);
        StopSignal(receiver)
    }

    pub fn is_stopped(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the stop is asked for (at once if it already was).
    pub async fn stopped(&mut self) {
        // An error means the sender is gone: nobody can ask any more, so
        // the owner is gone too and stopping is right.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// Tasks that hand something back (gate units, a lock, a declined order's
/// stock) or answer other buyers, spawned with [`spawn`].
static TRACKED: Tracked = Tracked {
    running: AtomicUsize::new(0),
    ended: Notify::const_new(),
};

struct Tracked {
    running: AtomicUsize,
    ended: Notify,
}

/// Decrements the count when the task ends, including when its runtime
/// drops it unfinished, so a lost task never holds the stop forever.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        if TRACKED.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            TRACKED.ended.notify_waiters();
        }
    }
}

/// `tokio::spawn`, counted: a graceful stop waits for the task to end.
/// For tasks that finish by themselves; a loop that runs until aborted
/// (a lease watchdog) would hold every stop for its whole timeout.
pub fn spawn<F>(task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Counted before the task exists, so a stop cannot see zero between
    // the spawn and the task's first poll.
    TRACKED.running.fetch_add(1, Ordering::SeqCst);
    let running = Running;
    tokio::spawn(async move {
        let _running = running;
        task.await
    })
}

/// How many tracked tasks are running now.
pub fn tracked_running() -> usize {
    TRACKED.running.load(Ordering::SeqCst)
}

/// Waits until no tracked task runs, at most until `deadline`; returns how
/// many were still running when it gave up (0 when all ended).
pub async fn tracked_ended(deadline: Instant) -> usize {
    loop {
        let ended = TRACKED.ended.notified();
        tokio::pin!(ended);
        // Registered before the count is read, so an end between the read
        // and the wait still wakes it.
        ended.as_mut().enable();
        let running = tracked_running();
        if running == 0 {
            return 0;
        }
        if tokio::time::timeout_at(deadline, ended).await.is_err() {
            return tracked_running();
        }
    }
}

/// SIGTERM and SIGINT (Ctrl-C), listened to from before the first arrives
/// until the process ends. Once tokio has caught a signal its default
/// action is gone, and one that arrives while no stream listens is
/// dropped: so the streams that start the stop are the ones that catch
/// the second signal, never new ones made after the first.
pub struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Must run inside the runtime.
    pub fn listen() -> std::io::Result<StopSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(StopSignals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(StopSignals {})
    }

    /// The next signal's name.
    pub async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                Err(_) => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_sees_the_stop_and_a_late_subscriber_too() {
        let stopping = Stopping::new();
        let mut early = stopping.signal();
        assert!(!early.is_stopped());
        stopping.stop_jobs();
        tokio::time::timeout(Duration::from_secs(1), early.stopped())
            .await
            .unwrap();
        let mut late = stopping.signal();
        assert!(late.is_stopped());
        tokio::time::timeout(Duration::from_secs(1), late.stopped())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_deadline_is_started_once_and_waited_for_from_before() {
        let stopping = Stopping::new();
        let passed = tokio::spawn({
            let stopping = stopping.clone();
            async move { stopping.deadline_passed().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!passed.is_finished(), "passed before it was started");
        let deadline = stopping.start_deadline(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            stopping.start_deadline(Duration::from_secs(60)),
            deadline,
            "a second start moved the deadline"
        );
        assert!(!passed.is_finished(), "passed before the deadline");
        tokio::time::timeout(Duration::from_secs(5), passed)
            .await
            .expect("still waiting after the deadline")
            .unwrap();
        assert!(Instant::now() >= deadline);
        // Once passed, it is passed for whoever asks later.
        tokio::time::timeout(Duration::from_millis(50), stopping.deadline_passed())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn never_does_not_fire() {
        let mut never = StopSignal::never();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), never.stopped())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn the_wait_ends_when_the_tracked_task_does() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(async move {
            let _ = released.await;
        });
        // Other tests of this binary may run tracked tasks too: only a
        // timeout here means the wait ignored this task's end.
        assert!(tracked_running() >= 1);
        let waiter = tokio::spawn(tracked_ended(Instant::now() + Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the wait ended before the task");
        release.send(()).unwrap();
        task.await.unwrap();
        assert_eq!(waiter.await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_dropped_task_is_no_longer_counted() {
        let task = spawn(std::future::pending::<()>());
        task.abort();
        let _ = task.await;
        assert_eq!(
            tracked_ended(Instant::now() + Duration::from_secs(5)).await,
            0
        );
    }
}
