//! What the database says about a drop: its transaction counters, and the
//! orders, stock and passes of the sale, checked after the run.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Integer, Nullable, Text};
use serde::Serialize;

use crate::db::split_database_url;

/// `pg_stat_database` of the drop's database, read from the server's
/// `postgres` database so that reading it is not counted against it.
pub(super) struct Counters {
    admin: PgConnection,
    datname: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Transactions {
    pub commits: i64,
    pub rollbacks: i64,
}

impl std::ops::Sub for Transactions {
    type Output = Transactions;
    fn sub(self, before: Transactions) -> Transactions {
        Transactions {
            commits: self.commits - before.commits,
            rollbacks: self.rollbacks - before.rollbacks,
        }
    }
}

impl Counters {
    pub fn new(database_url: &str) -> anyhow::Result<Counters> {
        let (server, datname) = split_database_url(database_url)?;
        Ok(Counters {
            admin: PgConnection::establish(&format!("{server}/postgres"))?,
            datname,
        })
    }

    pub fn now(&mut self) -> anyhow::Result<Transactions> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = BigInt)]
            commits: i64,
            #[diesel(sql_type = BigInt)]
            rollbacks: i64,
        }
        let row: Row = diesel::sql_query(
            "SELECT xact_commit::bigint AS commits, xact_rollback::bigint AS rollbacks \
             FROM pg_stat_database WHERE datname = $1",
        )
        .bind::<Text, _>(&self.datname)
        .get_result(&mut self.admin)?;
        Ok(Transactions {
            commits: row.commits,
            rollbacks: row.rollbacks,
        })
    }
}

/// The sale after its drop, from Postgres. Times are on the database's
/// clock, from the sale's `sale_starts_at`.
#[derive(Debug, Clone, Default, Serialize, QueryableByName)]
pub struct SaleChecked {
    /// Orders holding a line of the sale.
    #[diesel(sql_type = BigInt)]
    pub orders: i64,
    #[diesel(sql_type = BigInt)]
    pub units_sold: i64,
    #[diesel(sql_type = Integer)]
    pub stock_left: i32,
    /// Customers holding more than one order of the sale.
    #[diesel(sql_type = BigInt)]
    pub customers_with_two: i64,
    /// The opening to the first and to the last order's `created_at`.
    #[diesel(sql_type = Nullable<Double>)]
    pub first_order_ms: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    pub last_order_ms: Option<f64>,
    /// The opening to an order's `created_at`, over the sale's orders.
    #[diesel(sql_type = Nullable<Double>)]
    pub order_p50_ms: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    pub order_p99_ms: Option<f64>,
    #[diesel(sql_type = BigInt)]
    pub passes_issued: i64,
    #[diesel(sql_type = BigInt)]
    pub passes_used: i64,
    #[diesel(sql_type = BigInt)]
    pub passes_lapsed: i64,
    /// Orders named by a used pass of the same customer.
    #[diesel(sql_type = BigInt)]
    pub orders_from_a_pass: i64,
    #[diesel(sql_type = Nullable<Double>)]
    pub first_pass_ms: Option<f64>,
    /// Places in the waiting room, and those taken after the start.
    #[diesel(sql_type = BigInt)]
    pub places: i64,
    #[diesel(sql_type = BigInt)]
    pub late_places: i64,
}

impl SaleChecked {
    /// Sold out exactly, each unit once, nobody twice.
    pub fn sold_out_exactly(&self, units: i32) -> bool {
        self.orders == i64::from(units)
            && self.units_sold == i64::from(units)
            && self.stock_left == 0
            && self.customers_with_two == 0
    }

    /// As `sold_out_exactly`, and every order came from its buyer's pass.
    pub fn sold_through_passes(&self, units: i32) -> bool {
        self.sold_out_exactly(units)
            && self.passes_used == i64::from(units)
            && self.orders_from_a_pass == i64::from(units)
    }
}

pub(super) fn check_sale(database_url: &str, product: i64) -> anyhow::Result<SaleChecked> {
    let mut conn = PgConnection::establish(database_url)?;
    Ok(diesel::sql_query(
        "WITH sale AS (SELECT id, stock, sale_starts_at AS opening FROM products WHERE id = $1), \
         sold AS (SELECT o.id, o.customer_id, o.created_at, i.quantity \
                  FROM orders o JOIN order_items i ON i.order_id = o.id WHERE i.product_id = $1), \
         waits AS (SELECT extract(epoch FROM s.created_at - sale.opening)::float8 * 1000 AS ms \
                   FROM sold s, sale) \
         SELECT \
           (SELECT count(*) FROM sold) AS orders, \
           (SELECT coalesce(sum(quantity), 0)::bigint FROM sold) AS units_sold, \
           (SELECT stock FROM sale) AS stock_left, \
           (SELECT count(*) FROM (SELECT customer_id FROM sold GROUP BY customer_id \
                                  HAVING count(*) > 1) twice) AS customers_with_two, \
           (SELECT min(ms) FROM waits) AS first_order_ms, \
           (SELECT max(ms) FROM waits) AS last_order_ms, \
           (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM waits) AS order_p50_ms, \
           (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) FROM waits) AS order_p99_ms, \
           (SELECT count(*) FROM queue_admissions WHERE product_id = $1) AS passes_issued, \
           (SELECT count(*) FROM queue_admissions WHERE product_id = $1 AND state = 'used') \
             AS passes_used, \
           (SELECT count(*) FROM queue_admissions WHERE product_id = $1 AND state = 'lapsed') \
             AS passes_lapsed, \
           (SELECT count(*) FROM sold s JOIN queue_admissions a ON a.order_id = s.id \
              AND a.product_id = $1 AND a.state = 'used' AND a.customer_id = s.customer_id) \
             AS orders_from_a_pass, \
           (SELECT extract(epoch FROM min(a.issued_at) - sale.opening)::float8 * 1000 \
              FROM queue_admissions a, sale WHERE a.product_id = $1 GROUP BY sale.opening) \
             AS first_pass_ms, \
           (SELECT count(*) FROM queue_entries WHERE product_id = $1) AS places, \
           (SELECT count(*) FROM queue_entries WHERE product_id = $1 AND late) AS late_places",
    )
    .bind::<BigInt, _>(product)
    .get_result(&mut conn)?)
}
