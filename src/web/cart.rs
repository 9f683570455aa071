//! The cart: several products, one order. It lives in the session until
//! checkout, which buys every line or none.

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::forms::{CartForm, CsrfOnlyForm};
use super::idempotency::{answer_kept, once, Intent};
use super::session::{verify_csrf, SignedIn};
use super::shop::counted_purchase;
use super::views::cart::{CartLine, CartPage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::domain::{ProductId, Quantity};
use crate::error::AppError;
use crate::services::catalog::find_product;
use crate::services::checkout::{purchase, AnswerKey, Line};
use crate::services::{confirmation, Shop};

const CART_KEY: &str = "cart";
const MAX_LINES: usize = 20;

/// (product id, units) in the order they were added.
type StoredCart = Vec<(i64, i32)>;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(cart_page)
        .service(add)
        .service(update)
        .service(remove)
        .service(checkout);
}

fn load(session: &Session) -> StoredCart {
    session
        .get::<StoredCart>(CART_KEY)
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn store(session: &Session, cart: &StoredCart) -> Result<(), AppError> {
    session
        .insert(CART_KEY, cart)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))
}

#[get("/cart")]
pub async fn cart_page(
    shop: web::Data<Shop>,
    _signed_in: SignedIn,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let mut lines = Vec::new();
    for (product, units) in load(&session) {
        // A product deleted since it was added simply drops out of the cart.
        if let Ok(product) = find_product(&shop.pool, ProductId(product)).await {
            lines.push(CartLine::new(&product, units, Utc::now()));
        }
    }
    let page = CartPage {
        nav: Nav::from_session(&session),
        lines,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[post("/cart/add")]
pub async fn add(
    shop: web::Data<Shop>,
    _signed_in: SignedIn,
    session: Session,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let (product, quantity) = form.addition()?;
    find_product(&shop.pool, product).await?;
    let mut cart = load(&session);
    let lines = cart.len();
    match cart.iter_mut().find(|(id, _)| *id == product.get()) {
        Some((_, units)) => *units = Quantity::new(*units + quantity.get())?.get(),
        None if lines >= MAX_LINES => {
            return Err(AppError::Invalid(crate::error::Invalid::CartFull {
                max: MAX_LINES,
            }));
        }
        None => cart.push((product.get(), quantity.get())),
    }
    store(&session, &cart)?;
    Ok(see_other("/cart"))
}

/// Sets a line's quantity; 0 removes the line.
#[post("/cart/update")]
pub async fn update(
    _signed_in: SignedIn,
    session: Session,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let (product, quantity) = form.change()?;
    set_line(&session, product, quantity)
}

#[post("/cart/remove")]
pub async fn remove(
    _signed_in: SignedIn,
    session: Session,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    set_line(&session, form.removal()?, None)
}

/// Changes one line of the cart (`None` removes it) and goes back to the cart.
fn set_line(
    session: &Session,
    product: ProductId,
    quantity: Option<Quantity>,
) -> Result<HttpResponse, AppError> {
    let mut cart = load(session);
    match quantity {
        None => cart.retain(|(id, _)| *id != product.get()),
        Some(quantity) => {
            let line = cart
                .iter_mut()
                .find(|(id, _)| *id == product.get())
                .ok_or_else(|| AppError::NotFound(crate::error::Missing::CartLine))?;
            line.1 = quantity.get();
        }
    }
    store(session, &cart)?;
    Ok(see_other("/cart"))
}

/// One order for the whole cart: every line is bought or none is.
#[post("/cart/checkout")]
pub async fn checkout(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    request: HttpRequest,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    confirmation::vouched_by_session(&shop, account.id, account.confirmed);
    let cart = load(&session);
    let mut canonical = cart.clone();
    canonical.sort_unstable();
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        fields: format!("{canonical:?}"),
        names_order: true,
    };
    once(&shop, account.id, intent, |key| async {
        let order = counted_purchase(async {
            if cart.is_empty() {
                return Err(AppError::Invalid(crate::error::Invalid::CartEmpty));
            }
            let lines = cart
                .iter()
                .map(|(product, units)| {
                    Ok(Line {
                        product: ProductId(*product),
                        quantity: Quantity::new(*units)?,
                    })
                })
                .collect::<Result<Vec<_>, AppError>>()?;
            purchase(&shop, account.id, lines, key.map(AnswerKey::Claimed)).await
        })
        .await?;
        store(&session, &Vec::new())?;
        Ok(answer_kept(see_other(&format!("/orders/{order}"))))
    })
    .await
}
