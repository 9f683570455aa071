//! Fencing tokens: a number per acquisition of a product's lock that only
//! grows. The stock write carries it (`db::fence`), so a holder that lost its
//! lock without noticing cannot write over a later holder's work.

use super::{Lease, LockError, ProductLocks};
use crate::domain::ProductId;

/// Tokens of one Redis acquisition are `base + pass`: the next acquisition's
/// base is this much higher, above every pass of the one before.
pub(super) const TOKEN_STEP: i64 = 1_000;

/// Next fencing token base. A missing counter (first use, or Redis lost its
/// data) restarts at the caller's clock in microseconds times the step, which
/// is above every token handed out before, unless acquisitions outran a
/// million per second.
pub(super) const NEXT_TOKEN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('INCRBY', KEYS[1], ARGV[2])
";

/// Raises a fencing counter to at least ARGV[1]; never lowers it.
pub(super) const RAISE_TOKEN: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
";

impl ProductLocks {
    fn fence_key(&self, product: ProductId) -> String {
        format!(
            "{}promotion-product:{}:fence",
            self.inner.key_prefix, product
        )
    }

    /// Postgres refused a stock write because the row carries a fence at or
    /// above our token. If our lease still holds, nobody else took the lock
    /// since we did, so the counter in Redis is behind the database (it lost
    /// its data and restarted on a slow clock): move it past the database so
    /// the next holder's write goes through. Otherwise we are the stale holder
    /// and the refusal was the point. Says whether the counter was raised,
    /// so that work refused only because it was behind can be done again
    /// under a fresh acquisition.
    pub async fn after_refused_write(&self, lease: &Lease, product: ProductId, fence: i64) -> bool {
        if lease.check().is_ok() {
            tracing::warn!(%product, fence, "fencing counter was behind the database; raising it");
            let key = self.fence_key(product);
            self.raise_token(&key, fence).await.is_ok()
        } else {
            tracing::warn!(%product, fence, "a stale lock holder's stock write was refused by its fencing token");
            false
        }
    }

    /// The next fencing token of `product`. With several independent servers,
    /// a quorum's largest counter plus one is written back to a quorum, so the
    /// next holder's quorum (which overlaps ours) reads at least our token.
    pub(super) async fn next_token(&self, product: ProductId) -> Result<i64, LockError> {
        let key = self.fence_key(product);
        let epoch = chrono::Utc::now().timestamp_micros() * TOKEN_STEP;
        let script = &self.inner.next_token;
        let token = self
            .on_quorum(|mut connection| {
                let key = key.clone();
                async move {
                    script
                        .key(key)
                        .arg(epoch)
                        .arg(TOKEN_STEP)
                        .invoke_async::<i64>(&mut connection)
                        .await
                }
            })
            .await?
            .into_iter()
            .max()
            .unwrap_or_default();
        if self.inner.nodes.len() > 1 {
            self.raise_token(&key, token).await?;
        }
        Ok(token)
    }

    /// Raises the fencing counter at `key` to at least `floor` on a quorum.
    async fn raise_token(&self, key: &str, floor: i64) -> Result<(), LockError> {
        let script = &self.inner.raise_token;
        self.on_quorum(|mut connection| {
            let key = key.to_string();
            async move {
                script
                    .key(key)
                    .arg(floor)
                    .invoke_async::<i64>(&mut connection)
                    .await
            }
        })
        .await
        .map(|_| ())
    }
}
