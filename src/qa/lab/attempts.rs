//! One request of a contest, made the way a strategy takes stock.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer};
use redis::aio::MultiplexedConnection;

use super::Strategy;
use crate::db::{self, PgPool};
use crate::domain::{CustomerId, ProductId, Quantity, Refusal};
use crate::error::AppError;
use crate::qa::harness::ScratchDb;
use crate::services::checkout::{purchase, Line, PurchaseOutcome};
use crate::services::Shop;

pub(super) enum Attempt {
    Sold,
    Rejected,
    GaveUp,
    Error(String),
}

/// What every request of a lab run shares.
pub(super) struct Env {
    pub(super) redis: redis::Client,
    pub(super) prefix: String,
    pub(super) pool: PgPool,
    pub(super) shop: Shop,
    pub(super) shop_without_gate: Shop,
    pub(super) customers: Vec<CustomerId>,
    pub(super) watch_retries: u32,
    // Last: the pools above hold connections into it.
    pub(super) _db: ScratchDb,
}

#[derive(QueryableByName)]
pub(super) struct Stock {
    #[diesel(sql_type = Integer)]
    pub(super) stock: i32,
}

pub(super) const TAKE_ONE_LUA: &str = r"
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if stock < want then return -1 end
return redis.call('DECRBY', KEYS[1], want)
";

pub(super) async fn redis_attempt(
    strategy: Strategy,
    con: &mut MultiplexedConnection,
    key: &str,
    script: &redis::Script,
    env: &Env,
) -> redis::RedisResult<Attempt> {
    Ok(match strategy {
        Strategy::RedisGetDecr => {
            let stock: i64 = redis::cmd("GET").arg(key).query_async(con).await?;
            if stock < 1 {
                return Ok(Attempt::Rejected);
            }
            let _: i64 = redis::cmd("DECR").arg(key).query_async(con).await?;
            Attempt::Sold
        }
        Strategy::RedisPipeline | Strategy::RedisMulti => {
            let mut pipe = redis::pipe();
            if strategy == Strategy::RedisMulti {
                pipe.atomic();
            }
            let (before, _after): (i64, i64) = pipe
                .cmd("GET")
                .arg(key)
                .cmd("DECRBY")
                .arg(key)
                .arg(1)
                .query_async(con)
                .await?;
            if before >= 1 {
                Attempt::Sold
            } else {
                // The decrement ran whatever GET said: give the unit back.
                let _: i64 = redis::cmd("INCRBY")
                    .arg(key)
                    .arg(1)
                    .query_async(con)
                    .await?;
                Attempt::Rejected
            }
        }
        Strategy::RedisWatch => {
            for _ in 0..env.watch_retries {
                let _: () = redis::cmd("WATCH").arg(key).query_async(con).await?;
                let stock: i64 = redis::cmd("GET").arg(key).query_async(con).await?;
                if stock < 1 {
                    let _: () = redis::cmd("UNWATCH").query_async(con).await?;
                    return Ok(Attempt::Rejected);
                }
                let committed: Option<(i64,)> = redis::pipe()
                    .atomic()
                    .cmd("DECRBY")
                    .arg(key)
                    .arg(1)
                    .query_async(con)
                    .await?;
                if committed.is_some() {
                    return Ok(Attempt::Sold);
                }
            }
            Attempt::GaveUp
        }
        Strategy::RedisLua => {
            let left: i64 = script.key(key).arg(1).invoke_async(con).await?;
            if left >= 0 {
                Attempt::Sold
            } else {
                Attempt::Rejected
            }
        }
        _ => unreachable!("{strategy:?} is not a Redis strategy"),
    })
}

pub(super) async fn pg_attempt(
    strategy: Strategy,
    env: &Env,
    product: i64,
    request: usize,
) -> Result<Attempt, AppError> {
    if matches!(strategy, Strategy::Flashsale | Strategy::FlashsaleNoGate) {
        let shop = if strategy == Strategy::Flashsale {
            &env.shop
        } else {
            &env.shop_without_gate
        };
        let customer = env.customers[request % env.customers.len()];
        let line = Line {
            product: ProductId(product),
            quantity: Quantity::new(1)?,
        };
        return Ok(match purchase(shop, customer, vec![line], None).await? {
            PurchaseOutcome::Purchased(_) => Attempt::Sold,
            PurchaseOutcome::Refused(Refusal::SoldOut { .. }) => Attempt::Rejected,
            PurchaseOutcome::Busy | PurchaseOutcome::Unavailable(_) => Attempt::GaveUp,
            other => Attempt::Error(format!("{other:?}")),
        });
    }
    db::run(&env.pool, move |conn| {
        let read = |conn: &mut PgConnection, sql: &str| -> Result<i32, AppError> {
            Ok(diesel::sql_query(sql)
                .bind::<BigInt, _>(product)
                .get_result::<Stock>(conn)?
                .stock)
        };
        Ok(match strategy {
            Strategy::PgReadUpdate => {
                let stock = read(conn, "SELECT stock FROM products WHERE id = $1")?;
                if stock < 1 {
                    return Ok(Attempt::Rejected);
                }
                diesel::sql_query("UPDATE products SET stock = $2 WHERE id = $1")
                    .bind::<BigInt, _>(product)
                    .bind::<Integer, _>(stock - 1)
                    .execute(conn)?;
                Attempt::Sold
            }
            Strategy::PgForUpdate => conn.transaction(|conn| {
                let stock = read(conn, "SELECT stock FROM products WHERE id = $1 FOR UPDATE")?;
                if stock < 1 {
                    return Ok::<_, AppError>(Attempt::Rejected);
                }
                diesel::sql_query("UPDATE products SET stock = stock - 1 WHERE id = $1")
                    .bind::<BigInt, _>(product)
                    .execute(conn)?;
                Ok(Attempt::Sold)
            })?,
            Strategy::PgConditional => {
                let taken = diesel::sql_query(
                    "UPDATE products SET stock = stock - $1 WHERE id = $2 AND stock >= $1",
                )
                .bind::<Integer, _>(1)
                .bind::<BigInt, _>(product)
                .execute(conn)?;
                if taken == 1 {
                    Attempt::Sold
                } else {
                    Attempt::Rejected
                }
            }
            _ => unreachable!("{strategy:?} is not a Postgres strategy"),
        })
    })
    .await
}
