//! The runtime of the tasks that serve others one step at a time: each
//! product's batch leader, the purchase transactions' committers and the
//! waiting room's join writers.
//!
//! Why a runtime of their own: every wake-up of such a task (a batch handed
//! in, a commit answered, the next batch taken) lies on the path of every
//! buyer or joiner it serves, and a hot product has one leader for the whole
//! crowd. Spawned from a request they would run on that actix worker's
//! runtime, queued behind whatever requests the worker has ready (a crowd's
//! page views and refusals), once per wake-up. Here they have a thread that
//! is idle between their short steps, so the kernel runs it as soon as it
//! wakes. Their database work still runs on blocking threads (the
//! runtime's own, which carry the same thread name).
//!
//! Nothing synchronous may run on this thread: every product's leader, the
//! lease watchdogs of the locks they take, and this thread's own Redis
//! connections all wait behind it. Database work goes through `db::run`.
//! Tasks here are never dropped with a runtime (this one lives as long as
//! the process), so a test's leftover leader ends by itself, bounded by the
//! lock wait, the statement timeout and the pool's connection timeout.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// Process-wide, like the tracked-task count: started on first use and
/// never dropped (the process exits around it, see `shutdown`).
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("flashsale-serial")
            .enable_all()
            .build()
            .expect("the serial tasks' runtime starts")
    })
}

/// [`crate::shutdown::spawn`] (tracked: a graceful stop waits for it), on
/// the serial tasks' runtime. Tasks it spawns in turn run there too.
pub fn spawn<F>(task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let _on_serial = runtime().enter();
    crate::shutdown::spawn(task)
}
