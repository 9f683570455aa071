//! Calls of one Lua script on one product, gathered into one Redis call
//! while an earlier call for that product is on its way.
//!
//! A sold-out crowd, or a waiting room's pollers, send thousands of calls a
//! second for one product, each a small script. Starting a script costs
//! Redis more than the few commands inside it, and each call costs the shop
//! a wake-up of the connection's driver and two system calls. So a call
//! that finds another call for the same product in flight from the same
//! thread waits for it, and everything that waited goes as the next call:
//! one script that runs the calls one after another, in arrival order, each
//! with its own answer, atomically, exactly as if they had been sent one by
//! one. Nothing ever waits for company: a call that finds nothing in flight
//! goes at once, so a lone buyer pays no latency for the crowd's savings.
//!
//! Per thread, because each actix worker keeps its own Redis connection
//! (`redis_node`): a batch gathered across threads would wake the other
//! thread for every answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use tokio::sync::oneshot;

use crate::domain::ProductId;
use crate::error::AppError;

/// The waiting calls of one product on one thread.
pub struct Queue<I, O> {
    product: ProductId,
    state: Mutex<State<I, O>>,
}

struct State<I, O> {
    waiting: Vec<(I, oneshot::Sender<Result<O, AppError>>)>,
    /// A driver is sending this queue's calls; it stops only once it finds
    /// the queue empty, so a call queued meanwhile is never left behind.
    driven: bool,
}

/// Calls of one kind, per product and thread.
pub struct Batches<I, O> {
    queues: Mutex<QueuesByThread<I, O>>,
}

type QueuesByThread<I, O> = HashMap<(ProductId, ThreadId), Arc<Queue<I, O>>>;

impl<I, O> Default for Batches<I, O> {
    fn default() -> Self {
        Batches {
            queues: Mutex::new(HashMap::new()),
        }
    }
}

/// A queued call's answer, and the queue to drive when nobody drives it yet
/// (the caller then spawns a task that calls `Driver::next_batch` in a loop
/// and sends each batch).
pub struct Queued<I, O> {
    pub answer: oneshot::Receiver<Result<O, AppError>>,
    pub drive: Option<Driver<I, O>>,
}

impl<I, O> Batches<I, O> {
    pub fn enqueue(&self, product: ProductId, item: I) -> Queued<I, O> {
        let queue = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            queues
                .entry((product, std::thread::current().id()))
                .or_insert_with(|| {
                    Arc::new(Queue {
                        product,
                        state: Mutex::new(State {
                            waiting: Vec::new(),
                            driven: false,
                        }),
                    })
                })
                .clone()
        };
        let (reply, answer) = oneshot::channel();
        let mut state = queue.state();
        state.waiting.push((item, reply));
        let drive = (!state.driven).then(|| {
            state.driven = true;
            Driver {
                queue: queue.clone(),
                finished: false,
            }
        });
        drop(state);
        Queued { answer, drive }
    }
}

impl<I, O> Queue<I, O> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<I, O>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything waiting, in arrival order, at most `max` calls; None
    /// (and the queue undriven) when nothing waits.
    fn next_batch(&self, max: usize) -> Option<Batch<I, O>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.driven = false;
            return None;
        }
        let taken = state.waiting.len().min(max);
        let rest = state.waiting.split_off(taken);
        let batch = std::mem::replace(&mut state.waiting, rest);
        let (items, replies) = batch.into_iter().unzip();
        Some(Batch { items, replies })
    }
}

/// The right to drive a queue, taken by the call that found it undriven
/// (`Queued::drive`) and moved into the driver's task before it is spawned.
/// A driver that ends in any way other than finding its queue empty (its
/// task dropped unpolled by a runtime shutting down, a panic) must not leave
/// the queue marked driven, or every later call would wait for a driver that
/// is gone: the calls still waiting fail (their callers treat that as a
/// failed call, which may or may not have run) and the next call starts a
/// new driver.
pub struct Driver<I, O> {
    queue: Arc<Queue<I, O>>,
    finished: bool,
}

impl<I, O> Driver<I, O> {
    pub fn product(&self) -> ProductId {
        self.queue.product
    }

    /// Everything waiting, in arrival order, at most `max` calls; None once
    /// nothing waits, and from then on the queue is another driver's to take.
    pub fn next_batch(&mut self, max: usize) -> Option<Batch<I, O>> {
        let batch = self.queue.next_batch(max);
        self.finished = batch.is_none();
        batch
    }
}

impl<I, O> Drop for Driver<I, O> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.queue.state();
        state.driven = false;
        state.waiting.clear();
    }
}

/// Calls sent together, and where each one's answer goes.
pub struct Batch<I, O> {
    pub items: Vec<I>,
    replies: Vec<oneshot::Sender<Result<O, AppError>>>,
}

impl<I, O> Batch<I, O> {
    /// Hands each call its answer: `answers` in the order of `items`, or the
    /// error for all of them (the whole call failed, and may have run).
    /// A caller that has gone away drops its answer: callers whose answer
    /// hands something back run on tasks of their own for that reason.
    pub fn answer(self, answers: Result<Vec<O>, AppError>) {
        match answers {
            Ok(answers) if answers.len() == self.replies.len() => {
                for (reply, answer) in self.replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(answers) => {
                let error = format!(
                    "a batch of {} calls got {} answers",
                    self.replies.len(),
                    answers.len()
                );
                for reply in self.replies {
                    let _ = reply.send(Err(AppError::Internal(anyhow::anyhow!(error.clone()))));
                }
            }
            Err(error) => {
                let reason = match &error {
                    AppError::Unavailable(reason) => reason.clone(),
                    other => other.to_string(),
                };
                let internal = !matches!(error, AppError::Unavailable(_));
                for reply in self.replies {
                    let _ = reply.send(Err(if internal {
                        AppError::Internal(anyhow::anyhow!(reason.clone()))
                    } else {
                        AppError::Unavailable(reason.clone())
                    }));
                }
            }
        }
    }
}

/// A queued call's answer; a driver that went away without answering is a
/// failed call.
pub async fn answer_of<O>(
    answer: oneshot::Receiver<Result<O, AppError>>,
    what: &str,
) -> Result<O, AppError> {
    answer
        .await
        .unwrap_or_else(|_| Err(AppError::Unavailable(format!("{what}: no answer"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_queued_while_one_is_driven_go_together_in_arrival_order() {
        let batches: Batches<u32, u32> = Batches::default();
        let product = ProductId(7);
        let first = batches.enqueue(product, 1);
        let mut queue = first.drive.expect("the first call drives");
        let second = batches.enqueue(product, 2);
        let third = batches.enqueue(product, 3);
        assert!(second.drive.is_none() && third.drive.is_none());
        let batch = queue.next_batch(64).expect("three wait");
        assert_eq!(batch.items, vec![1, 2, 3]);
        batch.answer(Ok(vec![10, 20, 30]));
        assert!(queue.next_batch(64).is_none());
        // Undriven again: the next call drives.
        assert!(batches.enqueue(product, 4).drive.is_some());
    }

    #[test]
    fn a_batch_takes_at_most_max_calls() {
        let batches: Batches<u32, u32> = Batches::default();
        let mut queue = batches.enqueue(ProductId(1), 0).drive.unwrap();
        for n in 1..5 {
            batches.enqueue(ProductId(1), n);
        }
        assert_eq!(queue.next_batch(3).unwrap().items, vec![0, 1, 2]);
        assert_eq!(queue.next_batch(3).unwrap().items, vec![3, 4]);
        assert!(queue.next_batch(3).is_none());
    }

    #[test]
    fn a_driver_that_is_dropped_fails_the_waiting_calls_and_frees_the_queue() {
        let batches: Batches<u32, u32> = Batches::default();
        let mut first = batches.enqueue(ProductId(2), 1);
        let driver = first.drive.take().unwrap();
        drop(driver);
        assert!(first.answer.try_recv().is_err(), "its answer is gone");
        assert!(batches.enqueue(ProductId(2), 2).drive.is_some());
    }

    #[test]
    fn a_driver_that_found_its_queue_empty_leaves_the_next_driver_alone() {
        let batches: Batches<u32, u32> = Batches::default();
        let mut old = batches.enqueue(ProductId(4), 1).drive.unwrap();
        old.next_batch(8).unwrap().answer(Ok(vec![1]));
        assert!(old.next_batch(8).is_none());
        // Another thread's call takes the queue before the old driver is dropped.
        let mut waiting = batches.enqueue(ProductId(4), 2);
        let mut new = waiting.drive.take().expect("undriven again");
        drop(old);
        assert!(waiting.answer.try_recv().is_err(), "not answered yet");
        let batch = new.next_batch(8).expect("the call still waits");
        assert_eq!(batch.items, vec![2]);
    }

    #[test]
    fn a_failed_call_fails_every_call_in_it_alike() {
        let batches: Batches<u32, u32> = Batches::default();
        let mut one = batches.enqueue(ProductId(3), 1);
        let mut two = batches.enqueue(ProductId(3), 2);
        let batch = one.drive.take().unwrap().next_batch(8).unwrap();
        batch.answer(Err(AppError::Unavailable("gone".into())));
        for queued in [&mut one, &mut two] {
            assert!(matches!(
                queued.answer.try_recv(),
                Ok(Err(AppError::Unavailable(reason))) if reason == "gone"
            ));
        }
    }
}
