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

use super::schema::holdings;
use super::PgConn;
use crate::domain::{CustomerId, ProductId};

/// Units of `product` held by each of `customers` (customers holding none
/// are missing), or by every customer holding any when `customers` is None.
pub fn live_units(
    conn: &mut PgConn,
    product: ProductId,
    customers: Option<&[CustomerId]>,
) -> QueryResult<HashMap<CustomerId, i64>> {
    let of_product = holdings::table
        .filter(holdings::product_id.eq(product.get()))
        .filter(holdings::units.gt(0))
        .select((holdings::customer_id, holdings::units));
    let held: Vec<(i64, i32)> = match customers {
        Some(customers) => {
            let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
            of_product
                .filter(holdings::customer_id.eq_any(ids))
                .load(conn)?
        }
        None => of_product.load(conn)?,
    };
    Ok(held
        .into_iter()
        .map(|(customer, units)| (CustomerId(customer), i64::from(units)))
        .collect())
}

/// Units of each of `products` held by each of `customers`: what a
/// purchase transaction serving several products' buyers checks their
/// limits against, in one query.
pub fn live_units_of_products(
    conn: &mut PgConn,
    products: &[ProductId],
    customers: &[CustomerId],
) -> QueryResult<HashMap<ProductId, HashMap<CustomerId, i64>>> {
    let product_ids: Vec<i64> = products.iter().map(|p| p.get()).collect();
    let customer_ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let held: Vec<(i64, i64, i32)> = holdings::table
        .filter(holdings::product_id.eq_any(product_ids))
        .filter(holdings::customer_id.eq_any(customer_ids))
        .filter(holdings::units.gt(0))
        .select((holdings::product_id, holdings::customer_id, holdings::units))
        .load(conn)?;
    let mut units: HashMap<ProductId, HashMap<CustomerId, i64>> = HashMap::new();
    for (product, customer, held) in held {
        units
            .entry(ProductId(product))
            .or_default()
            .insert(CustomerId(customer), i64::from(held));
    }
    Ok(units)
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
