//! Before the lock: the stock gate admits a buyer's units (or refuses them
//! from Redis alone), or, with the gate off, a plain read of the product
//! turns away buyers the locked check would refuse anyway.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;

use super::outcome::Line;
use super::rules::refusal_for;
use crate::db;
use crate::db::schema::products;
use crate::domain::{CustomerId, Product, ProductId, Refusal};
use crate::error::{AppError, Missing};
use crate::gate::{Admission, AnswerRecord, StockGate};
use crate::services::stock_gate::{give_back_all, seed_if_absent};
use crate::services::{confirmation, Shop};

/// A new admission's name at the gate. Random from the thread's CSPRNG, not
/// one system call per buyer: it needs to be unique, not secret.
pub(super) fn new_admission_key() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
}

/// Admits every line at the gate, or none: a refused line hands back the
/// lines admitted before it, all under the admission `key`. Returns the
/// admission key, or the refusal.
/// Whatever ends it early gives back every line it may have admitted: a
/// call that failed or timed out may still have run in Redis, and giving
/// back an admission the gate never made does nothing.
pub(super) async fn admit_all(
    shop: &Shop,
    gate: &StockGate,
    customer: CustomerId,
    lines: &[Line],
    key: String,
) -> Result<Result<String, Refusal>, AppError> {
    let mut admitted = Vec::with_capacity(lines.len());
    for line in lines {
        let mut answer = gate
            .admit(line.product, customer, line.quantity, &key, None)
            .await;
        if let Ok(Admission::Unknown) = answer {
            // Created after this instance seeded, or lost with a Redis restart:
            // seed from the database (if still absent) and ask once more.
            if let Err(error) = seed_if_absent(shop, vec![line.product]).await {
                give_back_all(gate, &key, &admitted).await;
                return Err(error);
            }
            answer = gate
                .admit(line.product, customer, line.quantity, &key, None)
                .await;
        }
        let refusal = match answer {
            Ok(Admission::Admitted | Admission::Repeat) => {
                admitted.push(line.product);
                continue;
            }
            Ok(Admission::SoldOut { available }) => Refusal::SoldOut {
                product: None,
                available: available as i32,
            },
            Ok(Admission::Unknown) => {
                give_back_all(gate, &key, &admitted).await;
                return Err(unknown_after_seeding(shop, line.product).await);
            }
            Ok(Admission::LimitReached { held, limit }) => Refusal::LimitReached {
                product: None,
                limit: limit as i32,
                already: held,
            },
            Ok(
                Admission::Conflict
                | Admission::KeyReused
                | Admission::RefusedBefore(_)
                | Admission::AdmittedBefore { .. },
            ) => {
                give_back_all(gate, &key, &admitted).await;
                return Err(AppError::Internal(anyhow::anyhow!(
                    "a fresh admission key was already in the gate"
                )));
            }
            Err(error) => {
                admitted.push(line.product);
                give_back_all(gate, &key, &admitted).await;
                return Err(error);
            }
        };
        give_back_all(gate, &key, &admitted).await;
        return Ok(Err(refusal));
    }
    Ok(Ok(key))
}

/// What the gate says to a one-product purchase that carries its
/// idempotency key, whose answer the gate keeps.
pub(super) enum KeyedAdmission {
    Admitted,
    /// Refused now; the refusal is recorded under the key.
    Refused(Refusal),
    /// The key's request was refused before: the same refusal.
    RefusedBefore(Refusal),
    /// The key's request was admitted `age` ago as `admission`.
    AdmittedBefore {
        admission: String,
        age: Duration,
    },
}

/// Admits `line` as `admission` with the request's answer record. A call
/// that failed may still have run in Redis: its units are given back and
/// its record forgotten, both of which do nothing if it did not.
pub(super) async fn admit_keyed(
    shop: &Shop,
    gate: &StockGate,
    customer: CustomerId,
    line: &Line,
    admission: &str,
    record: &AnswerRecord<'_>,
) -> Result<KeyedAdmission, AppError> {
    let admit = || {
        gate.admit(
            line.product,
            customer,
            line.quantity,
            admission,
            Some(record),
        )
    };
    let mut answer = admit().await;
    if let Ok(Admission::Unknown) = answer {
        // See `admit_all`: seed from the database, then ask once more.
        answer = match seed_if_absent(shop, vec![line.product]).await {
            Ok(()) => admit().await,
            Err(error) => Err(error),
        };
    }
    let refusal = match answer {
        Ok(Admission::Admitted | Admission::Repeat) => return Ok(KeyedAdmission::Admitted),
        Ok(Admission::SoldOut { available }) => Refusal::SoldOut {
            product: None,
            available: available as i32,
        },
        Ok(Admission::LimitReached { held, limit }) => Refusal::LimitReached {
            product: None,
            limit: limit as i32,
            already: held,
        },
        Ok(Admission::RefusedBefore(refusal)) => return Ok(KeyedAdmission::RefusedBefore(refusal)),
        Ok(Admission::AdmittedBefore { admission, age }) => {
            return Ok(KeyedAdmission::AdmittedBefore { admission, age })
        }
        Ok(Admission::KeyReused) => return Err(AppError::KeyReused),
        Ok(Admission::Unknown) => return Err(unknown_after_seeding(shop, line.product).await),
        Ok(Admission::Conflict) => Err(AppError::Internal(anyhow::anyhow!(
            "a fresh admission key was already in the gate"
        )))?,
        Err(error) => {
            give_back_all(gate, admission, &[line.product]).await;
            if let Err(error) = gate
                .forget_admission(line.product, customer, record.key, admission)
                .await
            {
                tracing::warn!(%error, "could not forget a failed admission's answer record");
            }
            return Err(error);
        }
    };
    Ok(KeyedAdmission::Refused(refusal))
}

/// Unknown to the gate even after seeding: the product does not exist, or
/// the gate lost its counts again in between (Redis restarted). Only the
/// database can tell which, and the second is a 503, never "not found".
async fn unknown_after_seeding(shop: &Shop, product: ProductId) -> AppError {
    let found = db::run(&shop.pool, move |conn| {
        Ok(products::table
            .find(product.get())
            .select(products::id)
            .first::<i64>(conn)
            .optional()?)
    })
    .await;
    match found {
        Ok(Some(_)) => AppError::Unavailable("the stock gate lost its counts; try again".into()),
        Ok(None) => AppError::NotFound(Missing::Product(product)),
        Err(error) => error,
    }
}

/// A sale with a per-customer limit sells only to confirmed addresses (a
/// limit is per person): an unconfirmed buyer is turned away before the
/// gate, so they never hold a unit in flight that another buyer is refused
/// for. From the sale list's cache and the confirmed-customers cache; the
/// order's transaction decides again.
pub(super) async fn unconfirmed_for_a_limit(
    shop: &Shop,
    customer: CustomerId,
    lines: &[Line],
) -> Result<Option<Refusal>, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    let limited = lines.iter().find_map(|line| {
        let product = shelf.product(line.product)?;
        Some((product.name.clone(), product.per_customer_limit?))
    });
    let Some((name, limit)) = limited else {
        return Ok(None);
    };
    if confirmation::is_confirmed(shop, customer).await? {
        return Ok(None);
    }
    Ok(Some(Refusal::AddressUnconfirmed {
        product: Some(name),
        limit,
    }))
}

/// Turns away, without queueing for the lock, a buyer that the locked check
/// would refuse anyway: sold out, not open, unknown product. It can only say
/// no: a yes here is re-decided under the locks, so a stale read never sells.
/// After a sell-out this keeps the lock queue for buyers who can still win.
pub(super) async fn refusal_before_locking(
    shop: &Shop,
    lines: &[Line],
) -> Result<Option<Refusal>, AppError> {
    let ids: Vec<i64> = lines.iter().map(|l| l.product.get()).collect();
    let found: Vec<Product> = db::run(&shop.pool, move |conn| {
        Ok(products::table
            .filter(products::id.eq_any(ids))
            .select(Product::as_select())
            .load(conn)?)
    })
    .await?;
    let now = Utc::now();
    for line in lines {
        let product = found
            .iter()
            .find(|p| p.id == line.product.get())
            .ok_or_else(|| AppError::NotFound(Missing::Product(line.product)))?;
        if let Some(refusal) = refusal_for(product, line.quantity, now) {
            return Ok(Some(refusal));
        }
    }
    Ok(None)
}
