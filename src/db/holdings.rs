//! What customers hold of a product: the units in their live orders
//! (awaiting payment or paid). The per-customer limit is checked against it
//! under the product lock, and the stock gate's per-customer counts are
//! rebuilt from it.

use std::collections::HashMap;

use diesel::prelude::*;

use super::schema::{order_items, orders};
use super::PgConn;
use crate::domain::{CustomerId, OrderStatus, ProductId};

/// Units of `product` in the live orders of each of `customers`, or of
/// every customer holding any when `customers` is None.
pub fn live_units(
    conn: &mut PgConn,
    product: ProductId,
    customers: Option<&[CustomerId]>,
) -> QueryResult<HashMap<CustomerId, i64>> {
    let live = [
        OrderStatus::AwaitingPayment.as_str(),
        OrderStatus::Paid.as_str(),
    ];
    let live_of_product = order_items::table
        .inner_join(orders::table)
        .filter(orders::status.eq_any(live))
        .filter(order_items::product_id.eq(product.get()));
    let units = (orders::customer_id, diesel::dsl::sum(order_items::quantity));
    let held: Vec<(i64, Option<i64>)> = match customers {
        Some(customers) => {
            let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
            live_of_product
                .filter(orders::customer_id.eq_any(ids))
                .group_by(orders::customer_id)
                .select(units)
                .load(conn)?
        }
        None => live_of_product
            .group_by(orders::customer_id)
            .select(units)
            .load(conn)?,
    };
    Ok(held
        .into_iter()
        .map(|(customer, units)| (CustomerId(customer), units.unwrap_or(0)))
        .collect())
}

/// Units of each of `products` in the live orders of each of `customers`:
/// what a purchase transaction serving several products' buyers checks
/// their limits against, in one query.
pub fn live_units_of_products(
    conn: &mut PgConn,
    products: &[ProductId],
    customers: &[CustomerId],
) -> QueryResult<HashMap<ProductId, HashMap<CustomerId, i64>>> {
    let live = [
        OrderStatus::AwaitingPayment.as_str(),
        OrderStatus::Paid.as_str(),
    ];
    use diesel::sql_types::{Array, BigInt, Text};
    #[derive(QueryableByName)]
    struct Held {
        #[diesel(sql_type = BigInt)]
        product_id: i64,
        #[diesel(sql_type = BigInt)]
        customer_id: i64,
        #[diesel(sql_type = BigInt)]
        units: i64,
    }
    let product_ids: Vec<i64> = products.iter().map(|p| p.get()).collect();
    let customer_ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let held: Vec<Held> = diesel::sql_query(
        "SELECT i.product_id, o.customer_id, sum(i.quantity)::bigint AS units
         FROM order_items i JOIN orders o ON o.id = i.order_id
         WHERE o.status = ANY($1) AND i.product_id = ANY($2) AND o.customer_id = ANY($3)
         GROUP BY i.product_id, o.customer_id",
    )
    .bind::<Array<Text>, _>(live.to_vec())
    .bind::<Array<BigInt>, _>(product_ids)
    .bind::<Array<BigInt>, _>(customer_ids)
    .load(conn)?;
    let mut units: HashMap<ProductId, HashMap<CustomerId, i64>> = HashMap::new();
    for held in held {
        units
            .entry(ProductId(held.product_id))
            .or_default()
            .insert(CustomerId(held.customer_id), held.units);
    }
    Ok(units)
}
