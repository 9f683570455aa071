//! What customers hold of a product: the units in their live orders
//! (awaiting payment or paid), kept as one `holdings` row per customer and
//! product. The order's own statement adds to the row and every restore
//! takes from it, in the transaction that changes the order, under the
//! product's row lock; so the per-customer limit is checked with one
//! primary-key read per buyer, however much is already sold, and the
//! table's CHECK refuses a row over the limit whatever the code above did.
//! The stock gate's per-customer counts are rebuilt from it, and the ledger
//! audit compares it with the orders.

use std::collections::HashMap;

use diesel::prelude::*;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable};

use super::prepared::Prepared;
use super::schema::holdings;
use super::PgConn;
use crate::domain::{CustomerId, ProductId};

/// Units of `product` held by every customer holding any: what the stock
/// gate's per-customer counts are rebuilt from.
pub fn live_units(conn: &mut PgConn, product: ProductId) -> QueryResult<HashMap<CustomerId, i64>> {
    let held: Vec<(i64, i32)> = holdings::table
        .filter(holdings::product_id.eq(product.get()))
        .filter(holdings::units.gt(0))
        .select((holdings::customer_id, holdings::units))
        .load(conn)?;
    Ok(held
        .into_iter()
        .map(|(customer, units)| (CustomerId(customer), i64::from(units)))
        .collect())
}

/// What a buyer brings to a sale with a per-customer limit: the units their
/// live orders already hold of it, and whether their address is confirmed.
/// A limit is per person, and only a confirmed address is one person (one
/// confirmed account per canonical address, held by a unique index), so an
/// unconfirmed account buys none of a limited product.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holder {
    pub units: i64,
    pub confirmed: bool,
}

/// The buyers' accounts, and each one's rows of the products: a lookup of
/// the primary key per buyer, whatever the planner believes. Written as a
/// join, the planner judged a product's holdings by the statistics of the
/// last analyze; for a product on sale since then it saw none, read all of
/// them once per batch and matched them to each buyer, so every batch grew
/// slower as the sale sold (673 ms for 32 buyers against 200,000 holdings,
/// against 0.14 ms this way). `OFFSET 0` keeps the subquery a subquery, run
/// per buyer, instead of being merged back into that join.
pub const HOLDERS: &str = "
SELECT c.id AS customer_id, c.email_confirmed_at IS NOT NULL AS confirmed, h.product_id, h.units
FROM customers AS c
LEFT JOIN LATERAL (
    SELECT product_id, units FROM holdings
    WHERE customer_id = c.id AND product_id = ANY($1)
    OFFSET 0
) AS h ON true
WHERE c.id = ANY($2)";

#[derive(QueryableByName)]
struct HolderRow {
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Bool)]
    confirmed: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    product_id: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    units: Option<i32>,
}

/// Each of `customers` as a holder of each of `products`, in one query
/// (primary-key reads): what a purchase transaction checks its buyers'
/// limits against. A customer with no account is missing, so is refused
/// like an unconfirmed one.
pub fn holders(
    conn: &mut PgConn,
    products: &[ProductId],
    customers: &[CustomerId],
) -> QueryResult<HashMap<ProductId, HashMap<CustomerId, Holder>>> {
    let product_ids: Vec<i64> = products.iter().map(|p| p.get()).collect();
    let customer_ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let rows: Vec<HolderRow> = Prepared::new(HOLDERS)
        .bind::<Array<BigInt>, _>(product_ids)
        .bind::<Array<BigInt>, _>(customer_ids)
        .load(conn)?;
    let mut holders: HashMap<ProductId, HashMap<CustomerId, Holder>> = products
        .iter()
        .map(|&product| (product, HashMap::new()))
        .collect();
    for row in &rows {
        for of_product in holders.values_mut() {
            of_product.insert(
                CustomerId(row.customer_id),
                Holder {
                    units: 0,
                    confirmed: row.confirmed,
                },
            );
        }
    }
    for row in rows {
        if let (Some(product), Some(units)) = (row.product_id, row.units) {
            if let Some(holder) = holders
                .get_mut(&ProductId(product))
                .and_then(|of_product| of_product.get_mut(&CustomerId(row.customer_id)))
            {
                holder.units = i64::from(units);
            }
        }
    }
    Ok(holders)
}

/// Takes a restored order's `units` of `product` off what `customer`
/// holds, in the restore's transaction. A row that would go below zero (or
/// is missing) means the table and the orders disagree: the CHECK refuses
/// it and the restore rolls back rather than hand back units twice.
pub fn release(
    conn: &mut PgConn,
    product: ProductId,
    customer: CustomerId,
    units: i32,
) -> QueryResult<()> {
    let changed = diesel::update(holdings::table.find((product.get(), customer.get())))
        .set(holdings::units.eq(holdings::units - units))
        .execute(conn)?;
    if changed != 1 {
        return Err(diesel::result::Error::NotFound);
    }
    Ok(())
}
