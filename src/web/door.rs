//! The door's challenges, as the ALTCHA widget on the sign-up page and on
//! each waiting room's join form fetches them, and who the client is.

use std::net::{IpAddr, Ipv4Addr};

use actix_web::http::header;
use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::forms::parse_product_id;
use crate::config::TrustedProxies;
use crate::error::AppError;
use crate::services::door::{challenge_for, Door};
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(challenge);
}

#[derive(Debug, Deserialize)]
pub struct ChallengeQuery {
    /// The sale whose waiting room is to be joined; none for sign-up.
    #[serde(default)]
    sale: String,
}

/// A fresh challenge, never cached: each solution works once.
#[get("/door/challenge")]
pub async fn challenge(
    shop: web::Data<Shop>,
    query: web::Query<ChallengeQuery>,
) -> Result<HttpResponse, AppError> {
    let door = match query.sale.trim() {
        "" => Door::SignUp,
        sale => Door::Join(parse_product_id(sale)?),
    };
    let challenge = challenge_for(&shop, door).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(challenge))
}

/// The address the door and sign-in throttling count against: the TCP
/// peer, or what a trusted proxy in front of us says the client was.
pub fn client_ip(request: &HttpRequest, proxies: &TrustedProxies) -> IpAddr {
    let peer = request
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| addr.ip());
    let forwarded_for = request
        .headers()
        .get_all("X-Forwarded-For")
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect::<Vec<_>>();
    proxies.client_ip(peer, forwarded_for.into_iter())
}
