//! The ledger audit: replays stock_history against products, orders and items,
//! compares each customer's holdings with their live orders, and names every
//! disagreement. Used by `flashsale audit`, the admin
//! dashboard and the tests.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Text};

use crate::db::{self, PgConn, PgPool};
use crate::error::AppError;

#[derive(Debug, Clone, QueryableByName)]
pub struct ProductLedger {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Integer)]
    pub stock: i32,
    #[diesel(sql_type = Integer)]
    pub initial_stock: i32,
    #[diesel(sql_type = BigInt)]
    pub history_sum: i64,
    #[diesel(sql_type = BigInt)]
    pub adjustments: i64,
    #[diesel(sql_type = BigInt)]
    pub paid_units: i64,
    #[diesel(sql_type = BigInt)]
    pub awaiting_units: i64,
    #[diesel(sql_type = BigInt)]
    pub restored_units: i64,
    #[diesel(sql_type = BigInt)]
    pub items: i64,
    #[diesel(sql_type = BigInt)]
    pub purchase_rows: i64,
    #[diesel(sql_type = BigInt)]
    pub restored_items: i64,
    #[diesel(sql_type = BigInt)]
    pub restore_rows: i64,
    #[diesel(sql_type = BigInt)]
    pub mismatched_restore_rows: i64,
    #[diesel(sql_type = BigInt)]
    pub last_stock_after: i64,
    /// Customers whose holdings row disagrees with their live orders.
    #[diesel(sql_type = BigInt)]
    pub mismatched_holdings: i64,
}

impl ProductLedger {
    /// Units offered so far: the initial stock and every admin adjustment.
    pub fn offered(&self) -> i64 {
        i64::from(self.initial_stock) + self.adjustments
    }

    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let who = format!("product {} ({})", self.id, self.name);
        let stock = i64::from(self.stock);
        if i64::from(self.initial_stock) + self.history_sum != stock {
            problems.push(format!(
                "{who}: initial stock {} + history deltas {} = {} but stock is {}",
                self.initial_stock,
                self.history_sum,
                i64::from(self.initial_stock) + self.history_sum,
                self.stock
            ));
        }
        if self.stock < 0 {
            problems.push(format!("{who}: stock is negative ({})", self.stock));
        }
        let live = self.paid_units + self.awaiting_units;
        if live != self.offered() - stock {
            problems.push(format!(
                "{who}: live orders hold {live} units but offered {} - stock {} = {}",
                self.offered(),
                self.stock,
                self.offered() - stock
            ));
        }
        if self.purchase_rows != self.items {
            problems.push(format!(
                "{who}: {} order items but {} purchase history rows",
                self.items, self.purchase_rows
            ));
        }
        if self.restore_rows != self.restored_items {
            problems.push(format!(
                "{who}: {} items of restored orders but {} restore history rows",
                self.restored_items, self.restore_rows
            ));
        }
        if self.mismatched_restore_rows != 0 {
            problems.push(format!(
                "{who}: {} restore history rows whose reason does not match their order's status",
                self.mismatched_restore_rows
            ));
        }
        if self.mismatched_holdings != 0 {
            problems.push(format!(
                "{who}: {} customers' holdings disagree with the units of their live orders",
                self.mismatched_holdings
            ));
        }
        if self.last_stock_after >= 0 && self.last_stock_after != stock {
            problems.push(format!(
                "{who}: last history row says stock {} but stock is {}",
                self.last_stock_after, self.stock
            ));
        }
        problems
    }
}

#[derive(Debug, Clone)]
pub struct AuditReport {
    pub products: Vec<ProductLedger>,
    pub problems: Vec<String>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

const LEDGER_SQL: &str = r#"
SELECT p.id, p.name, p.stock, p.initial_stock,
  COALESCE((SELECT sum(h.delta) FROM stock_history h WHERE h.product_id = p.id), 0)::int8 AS history_sum,
  COALESCE((SELECT sum(h.delta) FROM stock_history h WHERE h.product_id = p.id AND h.reason = 'admin_adjust'), 0)::int8 AS adjustments,
  COALESCE((SELECT sum(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id
            WHERE i.product_id = p.id AND o.status = 'paid'), 0)::int8 AS paid_units,
  COALESCE((SELECT sum(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id
            WHERE i.product_id = p.id AND o.status = 'awaiting_payment'), 0)::int8 AS awaiting_units,
  COALESCE((SELECT sum(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id
            WHERE i.product_id = p.id AND o.status IN ('payment_failed', 'expired', 'refunded')), 0)::int8 AS restored_units,
  (SELECT count(*) FROM order_items i WHERE i.product_id = p.id) AS items,
  (SELECT count(*) FROM stock_history h WHERE h.product_id = p.id AND h.reason = 'purchase') AS purchase_rows,
  (SELECT count(*) FROM order_items i JOIN orders o ON o.id = i.order_id
    WHERE i.product_id = p.id AND o.status IN ('payment_failed', 'expired', 'refunded')) AS restored_items,
  (SELECT count(*) FROM stock_history h WHERE h.product_id = p.id
    AND h.reason IN ('payment_failed', 'expired', 'refund')) AS restore_rows,
  (SELECT count(*) FROM stock_history h JOIN orders o ON o.id = h.order_id
    WHERE h.product_id = p.id AND h.reason IN ('payment_failed', 'expired', 'refund')
      AND o.status <> CASE h.reason WHEN 'refund' THEN 'refunded' ELSE h.reason END) AS mismatched_restore_rows,
  COALESCE((SELECT h.stock_after FROM stock_history h WHERE h.product_id = p.id ORDER BY h.id DESC LIMIT 1), -1)::int8
    AS last_stock_after,
  (SELECT count(*) FROM
     (SELECT h.customer_id, h.units::int8 AS units FROM holdings h
       WHERE h.product_id = p.id AND h.units <> 0) AS held
     FULL JOIN
     (SELECT o.customer_id, sum(i.quantity)::int8 AS units FROM order_items i JOIN orders o ON o.id = i.order_id
       WHERE i.product_id = p.id AND o.status IN ('awaiting_payment', 'paid') GROUP BY o.customer_id) AS live
     ON held.customer_id = live.customer_id
   WHERE held.units IS DISTINCT FROM live.units) AS mismatched_holdings
FROM products p
ORDER BY p.id
"#;

/// The audit on a pooled connection (the admin dashboard's).
pub async fn audit(pool: &PgPool) -> Result<AuditReport, AppError> {
    db::run(pool, run_audit).await
}

pub fn run_audit(conn: &mut PgConn) -> Result<AuditReport, AppError> {
    // One snapshot, so a sale in progress cannot make a clean ledger look torn.
    conn.build_transaction().repeatable_read().read_only().run(|conn| {
        let products: Vec<ProductLedger> = diesel::sql_query(LEDGER_SQL).load(conn)?;
        let mut problems: Vec<String> = products.iter().flat_map(ProductLedger::problems).collect();
        let empty_orders: Count =
            diesel::sql_query("SELECT count(*) AS n FROM orders o WHERE NOT EXISTS (SELECT 1 FROM order_items i WHERE i.order_id = o.id)")
                .get_result(conn)?;
        if empty_orders.n != 0 {
            problems.push(format!("{} orders have no items", empty_orders.n));
        }
        Ok(AuditReport { products, problems })
    })
}
