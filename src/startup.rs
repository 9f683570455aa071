//! Building and running the HTTP server. Tests call `Application::build` with
//! `bind = 127.0.0.1:0` and read the port the OS picked.

use std::net::TcpListener;

use crate::web::session_cookie::SessionCookies;
use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceRequest, ServiceResponse};
use actix_web::http::ConnectionType;
use actix_web::middleware::{from_fn, DefaultHeaders, Next};
use actix_web::{web, App, HttpServer};

use crate::config::Settings;
use crate::services::Shop;
use crate::shutdown::{self, Stopping};

pub struct Application {
    port: u16,
    server: Server,
    shop: Shop,
    /// The background jobs; they stop with the server, so a stopped shop
    /// lets go of its database connections.
    jobs: Vec<tokio::task::JoinHandle<()>>,
    /// Read by `/readyz` and the jobs; set by the graceful stop.
    stopping: Stopping,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(&settings.bind)?;
        let port = listener.local_addr()?.port();
        let shop = Shop::new(settings).await?;
        // Before the first page, so cookies are trusted from the start; if
        // Postgres cannot answer yet, pages ask the sessions table meanwhile.
        if let Err(error) = crate::services::revocations::poll_revocations(&shop).await {
            tracing::warn!(%error, "could not load revoked sessions at start-up");
        }
        let stopping = Stopping::new();
        let server = serve(listener, shop.clone(), stopping.clone())?;
        crate::services::stock_gate::seed_all(&shop).await;
        let mut jobs = vec![crate::services::jobs::spawn(
            shop.clone(),
            shop.settings.jobs_interval,
            stopping.signal(),
        )];
        jobs.push(crate::services::revocations::spawn_revocation_watcher(
            shop.clone(),
            stopping.signal(),
        ));
        jobs.extend(crate::services::mail::sender::spawn(
            shop.clone(),
            stopping.signal(),
        ));
        jobs.extend(crate::services::jobs::spawn_reconcile(
            shop.clone(),
            shop.settings.reconcile_interval,
            stopping.signal(),
        ));
        Ok(Application {
            port,
            server,
            shop,
            jobs,
            stopping,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from outside (tests stop theirs when they end).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub fn shop(&self) -> &Shop {
        &self.shop
    }

    /// Serves until the server is stopped (through `handle`), then lets
    /// the jobs finish their current run and waits for the tracked tasks
    /// (`shutdown::spawn`), all of it within one `SHUTDOWN_TIMEOUT_SECS`:
    /// the deadline the graceful stop started when its drain ended, or one
    /// started when the server stopped.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = tokio::select! {
            served = self.server => served,
            () = self.stopping.deadline_passed() => {
                // actix would wait its own whole timeout, counted from when
                // it was asked to stop; the process must end now.
                tracing::warn!(
                    "the server did not stop within SHUTDOWN_TIMEOUT_SECS of the drain's end; \
                     what is still open is cut"
                );
                Ok(())
            }
        };
        let deadline = self
            .stopping
            .start_deadline(self.shop.settings.shutdown_timeout);
        self.stopping.stop_jobs();
        // The jobs run on this runtime: a job that was only waiting for its
        // next tick ends as soon as it is polled, so even with the deadline
        // passed only a job in the middle of a run is cut.
        tokio::task::yield_now().await;
        for mut job in self.jobs {
            // A run that outlives the deadline is cut: the process must end.
            if tokio::time::timeout_at(deadline, &mut job).await.is_err() {
                tracing::warn!("a background job did not finish its run in time; aborted");
                job.abort();
            }
        }
        // Tasks the jobs spawned (give-backs of expired orders) ran on this
        // runtime, which outlives the workers: wait for them too.
        let left = shutdown::tracked_ended(deadline).await;
        if left > 0 {
            tracing::warn!(left, "tasks still running at exit");
        }
        served
    }

    /// `flashsale serve`: serves until SIGTERM or SIGINT, then stops
    /// gracefully (see `crate::shutdown` for the steps and why).
    pub async fn run_until_signalled(self) -> std::io::Result<()> {
        let handle = self.server.handle();
        let stopping = self.stopping.clone();
        let drain = self.shop.settings.drain;
        let timeout = self.shop.settings.shutdown_timeout;
        let signals = match shutdown::StopSignals::listen() {
            Ok(signals) => Some(signals),
            Err(error) => {
                // Without a handler the signal's default action ends the
                // process at once, as before this stop existed.
                tracing::error!(%error, "cannot listen for SIGTERM; a stop will not be graceful");
                None
            }
        };
        tokio::spawn(async move {
            let Some(mut signals) = signals else {
                return;
            };
            let signal = signals.next().await;
            stopping.start_draining();
            tracing::info!(
                signal,
                drain_secs = drain.as_secs_f64(),
                "stopping: /readyz answers 503 while draining"
            );
            // An operator who sends a second signal wants the process gone
            // now: what the stop would have finished is left to the same
            // recovery as after a kill -9 (leases, reconcile, keys).
            tokio::spawn(async move {
                let signal = signals.next().await;
                tracing::warn!(
                    signal,
                    "second signal: exiting at once, without finishing the stop"
                );
                std::process::exit(FORCED_EXIT);
            });
            tokio::time::sleep(drain).await;
            // One bound for everything from here to the exit: each wait
            // below, and those in `run_until_stopped`, gets what is left.
            let deadline = stopping.start_deadline(timeout);
            // The jobs finish the run they are in and start no other: a
            // new run (and the give-backs it spawns) would spend the budget
            // the requests still open need.
            stopping.stop_jobs();
            // No new connections; those open go on, each closed after its
            // answer (see `close_while_draining`).
            handle.pause().await;
            stopping.refuse_new_requests();
            let left = shutdown::tracked_ended(deadline).await;
            if left > 0 {
                tracing::warn!(
                    left,
                    "in-flight tasks did not end within SHUTDOWN_TIMEOUT_SECS"
                );
            }
            tracing::info!("drained; stopping the server");
            // Graceful: open requests finish, until the deadline
            // (`run_until_stopped` stops waiting for the server then).
            handle.stop(true).await;
        });
        self.run_until_stopped().await?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The exit status of a process stopped by a second signal, as a shell
/// reports a process ended by SIGTERM (128 + 15).
pub const FORCED_EXIT: i32 = 143;

fn serve(listener: TcpListener, shop: Shop, stopping: Stopping) -> anyhow::Result<Server> {
    let shutdown_timeout = shop.settings.shutdown_timeout;
    let cookies = web::Data::new(SessionCookies::new(
        &shop.settings.session_key,
        shop.settings.cookie_secure,
    ));
    let shop = web::Data::new(shop);
    let stopping = web::Data::new(stopping);
    let server = HttpServer::new(move || {
        App::new()
            .wrap(from_fn(crate::web::session::check_session))
            .wrap(security_headers())
            .wrap(from_fn(crate::web::session_cookie::carry))
            // Outermost, so the id covers the session middleware and every page.
            .wrap(from_fn(crate::web::request_id::tag_request))
            .wrap(from_fn(close_while_draining))
            .app_data(shop.clone())
            .app_data(stopping.clone())
            .app_data(cookies.clone())
            .configure(crate::web::routes)
    })
    .workers(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8),
    )
    // The process's own handler (`run_until_signalled`) decides when to
    // stop: actix's would stop accepting at the first signal, before a load
    // balancer has seen `/readyz` fail.
    .disable_signals()
    // At most the whole stop's; `run_until_stopped` cuts it at the stop's
    // deadline, which the wait for tracked tasks has used part of.
    .shutdown_timeout(shutdown_timeout.as_secs().max(1))
    .listen(listener)?
    .run();
    Ok(server)
}

/// While draining, every answer closes its connection: a client (or load
/// balancer) holding a kept-alive connection then opens its next one,
/// which lands on another instance, instead of the stop cutting it. Once
/// the drain is over, a request is refused before anything starts (see
/// `Stopping::refuse_new_requests`).
async fn close_while_draining(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let stopping = request.app_data::<web::Data<Stopping>>().cloned();
    if stopping
        .as_ref()
        .is_some_and(|stopping| stopping.is_refusing())
    {
        return Err(crate::error::AppError::Unavailable("this instance is stopping".into()).into());
    }
    let mut response = next.call(request).await?;
    // Read after the answer, so requests in flight when the drain began
    // close their connections too.
    if stopping.is_some_and(|stopping| stopping.is_draining()) {
        response
            .response_mut()
            .head_mut()
            .set_connection_type(ConnectionType::Close);
    }
    Ok(response)
}

fn security_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; worker-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'",
        ))
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("Referrer-Policy", "same-origin"))
        .add(("X-Frame-Options", "DENY"))
}
