//! What this process remembers about its waiting rooms between calls, so a
//! join or a poll asks Postgres nothing it already asked: which seeds are
//! known to be committed, what setup this process last gave each queue, and
//! what the tick saw (the admission rate and when held units come back),
//! which `status` reads without Postgres.
//!
//! Process-wide, keyed by the shop's Redis prefix (one per database), not
//! kept on the `Shop`: two `Shop`s of one deployment in one process (tests)
//! may share it, since everything here is a cache of shared truth.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::domain::ProductId;
use crate::queue::QueueSetup;

/// How far back the admission rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Local {
    /// Products whose seed commitment is known to be in Postgres.
    pub seeded: HashSet<ProductId>,
    /// Products whose draw this process saw revealed (`drawn_at` set).
    pub revealed: HashSet<ProductId>,
    /// Products whose finished queue this process saw freed from Redis
    /// (or never there), so the tick stops asking.
    pub retired: HashSet<ProductId>,
    /// The setup this process last prepared each queue with.
    pub prepared: HashMap<ProductId, (DateTime<Utc>, Duration, i64)>,
    pace: HashMap<ProductId, Pace>,
}

/// What the tick last saw of one queue.
#[derive(Default)]
struct Pace {
    /// (when, admissions so far), oldest first, within `RATE_WINDOW`.
    samples: VecDeque<(Instant, i64)>,
    /// The latest deadline of an open pass or an unpaid order.
    held_until: Option<DateTime<Utc>>,
}

pub(super) fn local(prefix: &str) -> LocalGuard {
    static ALL: OnceLock<Mutex<HashMap<String, Local>>> = OnceLock::new();
    let all = ALL.get_or_init(Default::default);
    LocalGuard {
        guard: all.lock().unwrap_or_else(|e| e.into_inner()),
        prefix: prefix.to_string(),
    }
}

pub(super) struct LocalGuard {
    guard: MutexGuard<'static, HashMap<String, Local>>,
    prefix: String,
}

impl std::ops::Deref for LocalGuard {
    type Target = Local;
    fn deref(&self) -> &Local {
        static EMPTY: OnceLock<Local> = OnceLock::new();
        self.guard
            .get(&self.prefix)
            .unwrap_or_else(|| EMPTY.get_or_init(Local::default))
    }
}

impl std::ops::DerefMut for LocalGuard {
    fn deref_mut(&mut self) -> &mut Local {
        self.guard.entry(self.prefix.clone()).or_default()
    }
}

impl Local {
    /// Whether `setup` differs from what this process last prepared.
    pub fn needs_prepare(&self, product: ProductId, setup: &QueueSetup) -> bool {
        self.prepared.get(&product) != Some(&key(setup))
    }

    pub fn prepared_with(&mut self, product: ProductId, setup: &QueueSetup) {
        self.prepared.insert(product, key(setup));
    }

    /// The tick's count of admissions so far, and when held units come back.
    pub fn observe(
        &mut self,
        product: ProductId,
        admitted: i64,
        held_until: Option<DateTime<Utc>>,
    ) {
        let pace = self.pace.entry(product).or_default();
        let now = Instant::now();
        pace.samples.push_back((now, admitted));
        while pace
            .samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            pace.samples.pop_front();
        }
        pace.held_until = held_until;
    }

    /// Admissions per second over the recent window; None before two
    /// samples a second apart, or when nobody was admitted in it.
    pub fn admission_rate(&self, product: ProductId) -> Option<f64> {
        let pace = self.pace.get(&product)?;
        let (first_at, first) = pace.samples.front()?;
        let (last_at, last) = pace.samples.back()?;
        let span = last_at.duration_since(*first_at).as_secs_f64();
        (span >= 1.0 && last > first).then(|| (last - first) as f64 / span)
    }

    pub fn held_until(&self, product: ProductId) -> Option<DateTime<Utc>> {
        self.pace.get(&product)?.held_until
    }
}

fn key(setup: &QueueSetup) -> (DateTime<Utc>, Duration, i64) {
    (setup.starts_at, setup.pass, setup.units)
}
